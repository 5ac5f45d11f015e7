# Fig. 14a: SLO-compliant share in a 6-node cluster.
load "common.gp"
set title "Fig. 14a: 6 nodes"
set xlabel "functions"
set ylabel "SLO-compliant share"
set yrange [0:1.05]
set key bottom left
f = dir."/fig14a.csv"
plot for [s in "hiber native nonswap simpleswap"] f skip 1 using 2:(strcol(1) eq s ? $6 : 1/0) \
     with linespoints lw 2 pt 7 title s
