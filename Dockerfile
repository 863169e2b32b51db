# The kibo control plane on its embedded defaults (SQLite store, simulated runtime).
FROM python:3.11-slim
WORKDIR /src
COPY pyproject.toml README.md ./
COPY server server
COPY client client
COPY gen gen
RUN pip install --no-cache-dir . && rm -rf /src
WORKDIR /
VOLUME /var/lib/kibo
EXPOSE 50051 8080
HEALTHCHECK CMD python -c "import grpc,sys; from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as g; \
sys.exit(g.HealthStub(grpc.insecure_channel('127.0.0.1:50051')).Check(h.HealthCheckRequest(), timeout=2).status != 1)"
ENTRYPOINT ["kibo-ctrl", "serve", "--listen", "0.0.0.0:50051", "--http-listen", "0.0.0.0:8080", "--data-dir", "/var/lib/kibo"]
