#!/usr/bin/env bash
# Third H200 run of 2026-11-30 (late session): GEMV variants round 7 (one block a SM, with and
# without PDL) and Nsight Compute counters of the router GEMM and the GEMVs (ncu_gemv.py, raw page
# with warp states). Everything lands in $OUT/s3c.tgz.
set -u
R=/tmp/s3c
rm -rf "$R" && mkdir -p "$R"
pack() { tar czf "$OUT/s3c.tgz" -C /tmp s3c; }
OUT="$R" python3 benchmarks/variants_sm90.py 7 > "$R/variants_sm90_round7.log" 2>&1
grep -E "tag=" "$R/variants_sm90_round7.log" | awk '{for(i=1;i<=NF;i++) if($i~/^(tag|pdl|n|k|us|tbps|grid)=/) printf "%s ",$i; print ""}' | cut -c1-120; tail -1 "$R/variants_sm90_round7.log"; pack
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
OUT="$R" timeout 240 "$NCU" --profile-from-start off --clock-control none --cache-control all \
  --section WarpStateStats --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
  --csv --page raw --log-file "$R/ncu_raw.csv" python3 benchmarks/ncu_gemv.py > "$R/ncu.log" 2>&1
tail -2 "$R/ncu.log"; wc -l "$R/ncu_raw.csv"; pack
