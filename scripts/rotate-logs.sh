#!/usr/bin/env bash
# Rotate a run's logs before the next run writes them: DIR/x.log -> x.log.1 -> ... -> x.log.KEEP
# (the oldest dropped), and the pods' folder DIR/pods -> DIR/pods.1 -> ... the same way, so a
# run never overwrites the last one's logs. Usage: rotate-logs.sh DIR [KEEP, default 5].
set -euo pipefail
dir=$1
keep=${2:-5}
shopt -s nullglob
rotate() {  # rotate PATH: PATH.KEEP is dropped, PATH.i moves to PATH.i+1, PATH to PATH.1
    local path=$1 i
    [ -e "$path" ] || return 0
    rm -rf "$path.$keep"
    for ((i = keep - 1; i >= 1; i--)); do
        [ -e "$path.$i" ] && mv "$path.$i" "$path.$((i + 1))"
    done
    mv "$path" "$path.1"
}
for log in "$dir"/*.log; do
    [ -s "$log" ] && rotate "$log"
done
if [ -d "$dir/pods" ] && [ -n "$(ls -A "$dir/pods")" ]; then
    rotate "$dir/pods"
fi
