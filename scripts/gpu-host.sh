#!/usr/bin/env bash
# Official benches of family points, or an evolve run, on a GPU host, from a checkout of this
# repository, against a kcoral-server started here for the purpose and stopped on exit.
#
#   scripts/gpu-host.sh bench POINT...           POINT: NAME, or NAME:param=value,... over FAMILY's
#                                                defaults, or FAMILY/NAME[:...] for another family
#                                                (two_pass/tp fused_tiles/ft); a NAME given twice
#                                                is benched twice
#   scripts/gpu-host.sh evolve CONFIG [ARGS...]  evolve run CONFIG --remote <this server> ARGS
#
# Environment (defaults in brackets): WORKLOAD [forward_b1_t8192_h96], FAMILY [two_pass],
# OUT [gpu-host-out]: logs, salt, baseline cache, rendered points, bench-*.json;
# PORT [8901]; GPUS [0] (empty: a CPU server, CPU_WORKERS [2] workers); WORKERS [2] per GPU;
# BENCH_TIMEOUT [300] seconds a bench;
# WHEELS: a folder of scripts/offline-wheels.sh's wheels, for a host that cannot reach a
#   package index. They go into the checkout's .site/: the server's sandbox binds the
#   checkout, so the judge's baseline host imports them there (it does not bind /tmp).
# DEBS: a folder holding bubblewrap's .deb, where bwrap is not installed. It is unpacked into
#   OUT, never over /: a package's /lib can replace the system's link, and the C compiler
#   that Triton's launcher needs stops working.
# Relative paths (OUT, WHEELS, DEBS, and an evolve run's CONFIG and --db) are the caller's.
set -euo pipefail

CALLER=$PWD
REPO=$(cd "$(dirname "$0")/.." && pwd)
WORKLOAD=${WORKLOAD:-forward_b1_t8192_h96}
FAMILY=${FAMILY:-two_pass}
OUT=$(mkdir -p "${OUT:-gpu-host-out}" && cd "${OUT:-gpu-host-out}" && pwd)
[ -z "${WHEELS:-}" ] || WHEELS=$(cd "$WHEELS" && pwd)
[ -z "${DEBS:-}" ] || DEBS=$(cd "$DEBS" && pwd)
cd "$REPO"
PORT=${PORT:-8901}
GPUS=${GPUS-0}
URL=http://127.0.0.1:$PORT

die() { echo "gpu-host: $*" >&2; exit 1; }
usage() { sed -n '2,10p' "$0" >&2; exit 2; }
[ $# -ge 1 ] || usage
command=$1; shift
case $command in
    bench|evolve) [ $# -ge 1 ] || usage ;;
    *) usage ;;
esac

# One script per OUT at a time: two would share its salt, baseline cache and reports.
if command -v flock >/dev/null; then
    exec 9> "$OUT/.lock"
    flock -n 9 || die "another gpu-host.sh is using $OUT: wait for it or set OUT"
fi

export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
if [ -n "${WHEELS:-}" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$REPO/.site" "$WHEELS"/*.whl
    export PYTHONPATH=$REPO/.site:$PYTHONPATH
fi
if ! command -v bwrap >/dev/null; then
    [ -n "${DEBS:-}" ] || die "bwrap is not installed: install bubblewrap, or give DEBS=FOLDER holding its .deb"
    dpkg -x "$(ls "$DEBS"/bubblewrap_*.deb | head -1)" "$OUT/bwrap"
    export PATH=$OUT/bwrap/usr/bin:$PATH
fi

# Every point rendered before anything is compiled or started: a typo costs nothing.
folders=()
names=()
if [ "$command" = bench ]; then
    for point in "$@"; do
        spec=${point%%:*}
        family=$FAMILY
        name=$spec
        if [[ $spec == */* ]]; then family=${spec%%/*}; name=${spec#*/}; fi
        [[ $name =~ ^[A-Za-z0-9_.-]+$ ]] || die "point $point: name it with letters, digits, '_', '.' or '-' (it names its report)"
        [[ $family =~ ^[A-Za-z0-9_-]+$ ]] || die "point $point: name its family with letters, digits, '_' or '-'"
        values=()
        [ "$point" = "$spec" ] || IFS=, read -ra values <<< "${point#*:}"
        folder=$(python3 -m evolve render "$family" "${values[@]}" --out "$OUT/points") || die "point $point: not rendered"
        folders+=("$folder")
        names+=("$name")
    done
fi

# A server left by an earlier run on this port would take our requests with its own
# environment: refuse rather than measure on it.
if python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', $PORT), 1)" 2>/dev/null; then
    die "port $PORT is taken (a server of an earlier run?): stop it or set PORT"
fi

[ -s "$OUT/salt" ] || (umask 077 && python3 -c "import secrets; print(secrets.token_hex(32))" > "$OUT/salt")
chmod 600 "$OUT/salt"   # one left by an older script may not be private
server=(python3 -m kcoral_server --port "$PORT" --holdout-salt-file "$OUT/salt")
if [ -n "$GPUS" ]; then
    echo "gpu-host: compiling the baseline into $OUT/baseline-cache"
    python3 -m kcoral baseline-cache "$OUT/baseline-cache" "$WORKLOAD" > "$OUT/baseline-cache.log" 2>&1 \
        || { tail -5 "$OUT/baseline-cache.log" >&2; die "the baseline did not compile (log: $OUT/baseline-cache.log)"; }
    server+=(--gpus "$GPUS" --workers-per-gpu "${WORKERS:-2}" --trusted-cache "$OUT/baseline-cache")
else
    server+=(--cpu-workers "${CPU_WORKERS:-2}")
fi
"${server[@]}" > "$OUT/server.log" 2>&1 9>&- &
server_pid=$!
trap 'kill $server_pid 2>/dev/null; wait $server_pid 2>/dev/null || true' EXIT
# Ready when this server says it listens on PORT and /health answers with its instance id:
# a server that took the port since the check above would answer for us otherwise.
python3 - "$PORT" "$server_pid" "$OUT/server.log" <<'EOF' || { tail -20 "$OUT/server.log" >&2; die "the server did not start (log: $OUT/server.log)"; }
import json, os, sys, time, urllib.request
port, pid, log = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
for _ in range(240):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit(1)
    ours = []
    with open(log, errors="replace") as fh:
        for line in fh:
            try:
                e = json.loads(line)
            except ValueError:   # not an event, or one still being written
                continue
            if isinstance(e, dict) and e.get("event") == "listening" and e.get("port") == port:
                ours.append(e.get("instance_id"))
    if ours:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                sys.exit(0 if json.load(r).get("instance_id") == ours[0] else 1)
        except (OSError, ValueError):   # not answering yet: ask again
            pass
    time.sleep(0.5)
sys.exit(1)
EOF
echo "gpu-host: server at $URL (log: $OUT/server.log)"

if [ "$command" = evolve ]; then
    config=$1; shift
    cd "$CALLER"   # its config, --db and gen/ as the caller named them
    python3 -m evolve run "$config" --remote "$URL" "$@"
    exit
fi

for j in "${!folders[@]}"; do
    name=${names[j]}
    stem=$OUT/bench-$((j + 1))-$name   # reports numbered from 1, in the order given
    report=$stem.json
    python3 -m kcoral bench "$WORKLOAD" "${folders[j]}" --remote "$URL" --timeout "${BENCH_TIMEOUT:-300}" --json \
        > "$report" 2> "$stem.err" || true
    python3 - "$name" "$report" <<'EOF'
import json, sys
name, path = sys.argv[1], sys.argv[2]
try:
    r = json.load(open(path))
    if r["passed"]:
        print(f"{name:12s} {r['kernel_ms']:.4f} ms  baseline {r['baseline_ms']:.4f} ms  {r['speedup']:.3f}x  "
              f"spread {100 * (r.get('spread') or 0):.2f} %")
    else:
        print(f"{name:12s} failed: {r['failure_kind']}: {r['message'].splitlines()[0] if r['message'] else ''}")
except Exception as exc:  # one unreadable report must not stop the benches after it
    print(f"{name:12s} no readable report ({type(exc).__name__}; stderr beside it)")
EOF
done
