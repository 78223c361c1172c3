#!/usr/bin/env bash
# Runs every fuzz binary in BIN_DIR for SECONDS each, all in parallel, with corpora and
# findings under OUT_DIR:
#   OUT_DIR/<target>/corpus     the corpus (seeded from BIN_DIR/seeds/<target> if present)
#   OUT_DIR/<target>/artifacts  crashes, timeouts, leaks (empty: no finding)
#   OUT_DIR/<target>/log        libFuzzer's output
# JOBS_PER_TARGET (default: cores / targets, at least 1) libFuzzer workers share each corpus.
# Exit status: non-zero if any target left an artifact.
#
#   fuzz/run-all.sh .devbin/fuzz 600 /tmp/fuzz-out
set -euo pipefail
if [[ $# -lt 3 ]]; then
    echo "usage: $0 BIN_DIR SECONDS OUT_DIR" >&2
    exit 2
fi
mkdir -p "$3"
bin_dir=$(realpath "$1") seconds=$2 out_dir=$(realpath "$3")
targets=()
for bin in "$bin_dir"/*; do
    [[ -f $bin && -x $bin ]] && targets+=("$bin")
done
if [[ ${#targets[@]} -eq 0 ]]; then
    echo "no fuzz binaries in $bin_dir" >&2
    exit 2
fi
cores=$(nproc)
jobs=${JOBS_PER_TARGET:-$(( cores / ${#targets[@]} > 0 ? cores / ${#targets[@]} : 1 ))}
pids=()
for bin in "${targets[@]}"; do
    name=$(basename "$bin")
    dir="$out_dir/$name"
    mkdir -p "$dir/corpus" "$dir/artifacts"
    seeds=()
    [[ -d "$bin_dir/seeds/$name" ]] && seeds=("$bin_dir/seeds/$name")
    echo "$name: $seconds s, $jobs workers, corpus $dir/corpus"
    # -max_len: the recovery seeds are ~100 KB; room for growth. -rss_limit_mb: the store
    # maps a heap and its stripes per run.
    # From inside $dir: libFuzzer writes its workers' fuzz-N.log files to the current folder.
    (cd "$dir" && exec "$bin" "$dir/corpus" "${seeds[@]}" \
        -max_total_time="$seconds" -jobs="$jobs" -workers="$jobs" \
        -max_len=262144 -rss_limit_mb=4096 -timeout=30 -print_final_stats=1 \
        -artifact_prefix="$dir/artifacts/" >"$dir/log" 2>&1) &
    pids+=($!)
done
for pid in "${pids[@]}"; do
    wait "$pid" || true
done
status=0
for bin in "${targets[@]}"; do
    name=$(basename "$bin")
    dir="$out_dir/$name"
    found=$(find "$dir/artifacts" -type f | wc -l)
    units=$(grep -ho 'stat::number_of_executed_units: *[0-9]*' "$dir"/log "$dir"/fuzz-*.log 2>/dev/null | awk '{s += $2} END {print s + 0}')
    corpus=$(find "$dir/corpus" -type f | wc -l)
    echo "$name: $units runs, corpus $corpus, findings $found"
    if [[ $found -gt 0 ]]; then
        find "$dir/artifacts" -type f | sed 's/^/    /'
        status=1
    fi
done
exit $status
