# Fig. 11: the full policies against their ablations (and, dashed, an ideal allocator).
load "common.gp"
set title "Fig. 11: full policies and ablations (4 GPUs)"
set xlabel "functions"
set ylabel "SLO-compliant share"
set yrange [0:1.05]
set key bottom left
f = dir."/fig11.csv"
plot for [s in "hiber hiber-fifo hiber-random hiber-lru hiber-block"] \
     f skip 1 using 2:(strcol(1) eq s ? $6 : 1/0) with linespoints lw 2 pt 7 title s, \
     f skip 1 using 2:(strcol(1) eq "hiber-ideal-pool" ? $6 : 1/0) with linespoints lw 1 dt 2 pt 6 \
       lc rgb "gray40" title "hiber-ideal-pool"
