#!/bin/sh
# table.sh runs bench/memory's Uniform and Zipf workloads ROUNDS times
# (default 5), every peer once per round, one after another in the same
# process, and prints the median ns per decision of each peer and the
# median, over the rounds, of each peer's time divided by sluice's in the
# same round. From bench/:
#
#	ROUNDS=5 memory/table.sh
#
# BENCH picks the workloads (a -test.bench pattern, default 'Uniform|Zipf');
# BENCHTIME is -test.benchtime (default 1s).
set -eu
cd "$(dirname "$0")"
rounds=${ROUNDS:-5}
bench=${BENCH:-Uniform|Zipf}
benchtime=${BENCHTIME:-1s}
bin=$(mktemp -d)/memory.test
trap 'rm -rf "$(dirname "$bin")"' EXIT
go test -c -o "$bin" .
out=$(dirname "$bin")/runs.txt
for r in $(seq "$rounds"); do
	echo "round $r of $rounds" >&2
	"$bin" -test.run '^$' -test.bench "$bench" -test.benchtime "$benchtime" | awk -v r="$r" '/^Benchmark/ { print r, $1, $3 }' >> "$out"
done
# Lines: round, name (Benchmark<workload>/<shape>/peer=<peer>-<procs>), ns/op.
awk '
function median(list,   n, a, i, j, t) {
	n = split(list, a, " ")
	for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
	return n % 2 ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2
}
{
	name = $2; sub(/-[0-9]+$/, "", name)
	cell = name; sub(/\/peer=.*/, "", cell)
	peer = name; sub(/.*peer=/, "", peer)
	ns[cell, peer] = ns[cell, peer] " " $3
	round[cell, peer, $1] = $3
	if (!((cell, peer) in seen)) { seen[cell, peer] = 1; peers[cell] = peers[cell] " " peer }
	if (!(cell in cells)) { cells[cell] = ++ncells; order[ncells] = cell }
	rounds[$1] = 1
}
END {
	printf "| workload | peer | ns/decision (median) | ÷ sluice (median of rounds) |\n|---|---|---:|---:|\n"
	for (c = 1; c <= ncells; c++) {
		cell = order[c]
		np = split(peers[cell], ps, " ")
		for (p = 1; p <= np; p++) {
			ratios = ""
			for (r in rounds) if ((cell, ps[p], r) in round && (cell, "sluice", r) in round) ratios = ratios " " round[cell, ps[p], r] / round[cell, "sluice", r]
			printf "| %s | %s | %.1f | %.2f× |\n", cell, ps[p], median(ns[cell, ps[p]]), median(ratios)
		}
	}
}' "$out"
