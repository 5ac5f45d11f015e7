# Fig. 10: SLO-compliant share vs functions, late binding against early binding.
load "common.gp"
set title "Fig. 10: SLO-compliant functions on one 4-GPU node"
set xlabel "functions"
set ylabel "SLO-compliant share"
set yrange [0:1.05]
set key bottom left
f = dir."/fig10.csv"
plot for [s in "hiber native infless-ka"] f skip 1 using 2:(strcol(1) eq s ? $6 : 1/0) \
     with linespoints lw 2 pt 7 title s
