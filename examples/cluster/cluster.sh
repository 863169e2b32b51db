#!/bin/sh
# A kibo control plane across machines: N `kibo-ctrl serve` replicas on one PostgreSQL
# database, none with a node of its own, and M `kibo-ctrl node` agents (README: "Running
# across machines"). tests/system/test_cluster.py starts its replicas and nodes with this
# script, so these are the command lines the cluster test runs.
#
#   cluster.sh replica I     run replica I (1-based) in the foreground (exec: the pid is kibo-ctrl's)
#   cluster.sh node I        run node agent I in the foreground
#   cluster.sh up            every replica and node on this host, each restarted when it exits
#                            (a deposed leader stops itself and comes back as a follower)
#
# Settings (environment):
#   KIBO_STORE               postgresql://USER@HOST:PORT/DB (required for replicas)
#   KIBO_REPLICA_ADDRESSES   the replicas' gRPC addresses, comma-separated
#                            (default 127.0.0.1:50051,127.0.0.1:50061,127.0.0.1:50071)
#   KIBO_HTTP_ADDRESSES      their Connect/HTTP addresses, comma-separated (default: none, gRPC only)
#   KIBO_NODE_LISTEN         where each serves the nodes (mutual TLS), comma-separated (default:
#                            each replica's gRPC port + 2: 50053, 50063, 50073); unused with
#                            --insecure-no-auth or --insecure-node-link
#   KIBO_NODES               how many node agents `up` starts (default 3)
#   KIBO_RUNTIME             the nodes' runtime: process (sandboxes) or sim (default process)
#   KIBO_CLUSTER_DIR         where replicas and nodes keep their data dirs (default /var/lib/kibo)
#   KIBO_CTRL                how to run kibo-ctrl (default kibo-ctrl)
#   KIBO_SERVE_FLAGS         more flags for every replica (e.g. --tls-cert ... or --insecure-no-auth)
#   KIBO_NODE_FLAGS          more flags for every node (e.g. --labels zone=a); a node's join
#                            token comes from KIBO_NODE_TOKEN (kibo-ctrl token create --node node-I)
set -eu

REPLICAS=${KIBO_REPLICA_ADDRESSES:-127.0.0.1:50051,127.0.0.1:50061,127.0.0.1:50071}
HTTP=${KIBO_HTTP_ADDRESSES:-}
NODE_LISTEN=${KIBO_NODE_LISTEN:-}
DIR=${KIBO_CLUSTER_DIR:-/var/lib/kibo}
CTRL=${KIBO_CTRL:-kibo-ctrl}
RUNTIME=${KIBO_RUNTIME:-process}

# The I-th entry (1-based) of a comma-separated list; empty past its end.
count() { echo "$1" | tr ',' '\n' | grep -c . || true; }
nth() { [ "$2" -le "$(count "$1")" ] && echo "$1" | cut -d, -f"$2" || true; }

# The replicas' list starting at entry I: each node tries a different replica first.
rotated() {
    n=$(count "$REPLICAS")
    i=$(( ($1 - 1) % n + 1 ))
    echo "$REPLICAS,$REPLICAS" | cut -d, -f"$i-$((i + n - 1))"
}

replica() {
    listen=$(nth "$REPLICAS" "$1")
    [ -n "$listen" ] || { echo "cluster.sh: no replica $1 in KIBO_REPLICA_ADDRESSES" >&2; exit 2; }
    # Several replicas on one host need a node port each.
    nodes=$(nth "$NODE_LISTEN" "$1")
    [ -n "$nodes" ] || nodes="${listen%:*}:$(( ${listen##*:} + 2 ))"
    # shellcheck disable=SC2086  # KIBO_CTRL and the flag lists are word lists
    exec $CTRL serve --store "${KIBO_STORE:?set KIBO_STORE=postgresql://USER@HOST:PORT/DB}" \
        --no-local-node --listen "$listen" --http-listen "$(nth "$HTTP" "$1")" \
        --node-listen "$nodes" --data-dir "$DIR/replica-$1" ${KIBO_SERVE_FLAGS:-}
}

node() {
    # shellcheck disable=SC2086
    exec $CTRL node --control-plane "$(rotated "$1")" --runtime "$RUNTIME" \
        --data-dir "$DIR/node-$1" --node-id "node-$1" ${KIBO_NODE_FLAGS:-}
}

# Run `cluster.sh ROLE I` again whenever it exits (what systemd's Restart=always does).
supervise() {
    while :; do
        "$0" "$1" "$2" || true
        sleep 1
    done
}

case "${1:-}" in
    replica) replica "${2:?replica number}" ;;
    node) node "${2:?node number}" ;;
    up)
        i=1
        while [ "$i" -le "$(count "$REPLICAS")" ]; do supervise replica "$i" & i=$((i + 1)); done
        i=1
        while [ "$i" -le "${KIBO_NODES:-3}" ]; do supervise node "$i" & i=$((i + 1)); done
        trap 'kill 0' INT TERM
        wait
        ;;
    *)
        echo "usage: cluster.sh replica I | node I | up" >&2
        exit 2
        ;;
esac
