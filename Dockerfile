# The kibo control plane. README.md ("Docker") has the two `docker run` lines:
#   - simulated runtime (the default CMD): no privileges, as the unprivileged user kibo (10001);
#   - real sandboxes: `--privileged --user root ... kibo --runtime process` (bubblewrap needs
#     namespaces and mounts, the limits a writable cgroup tree).
# The admin token is written to the volume on first start: `docker exec kibo cat /var/lib/kibo/admin.token`.
FROM python:3.11-slim-bookworm

# bubblewrap: the process runtime's sandbox; tini: a PID 1 that reaps the supervisors' exits.
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap=0.8.* tini=0.19.* \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY pyproject.toml README.md ./
COPY server server
COPY client client
COPY gen gen
RUN pip install --no-cache-dir . && rm -rf /src

# The data dir belongs to kibo, so a named volume made from it does too.
RUN useradd --create-home --uid 10001 --user-group kibo \
    && mkdir -p /var/lib/kibo \
    && chown kibo:kibo /var/lib/kibo
WORKDIR /var/lib/kibo
VOLUME /var/lib/kibo
EXPOSE 50051 8080
ENV KIBO_LISTEN=0.0.0.0:50051 KIBO_HTTP_LISTEN=0.0.0.0:8080 KIBO_DATA_DIR=/var/lib/kibo
USER 10001:10001

HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import grpc, sys; from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as g; sys.exit(g.HealthStub(grpc.insecure_channel('127.0.0.1:50051')).Check(h.HealthCheckRequest(), timeout=2).status != h.HealthCheckResponse.SERVING)"]

ENTRYPOINT ["tini", "--", "kibo-ctrl", "serve"]
CMD ["--runtime", "sim"]
