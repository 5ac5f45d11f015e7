# Queueing: RRC against FIFO and gShare, Poisson (left) and bursty (right) arrivals.
load "common.gp"
set terminal pngcairo size 900,400 font ",10" noenhanced
set output out
set multiplot layout 1,2
set xlabel "functions"
set ylabel "SLO-compliant share"
set yrange [0:1.05]
set key bottom left
do for [p in "poisson bursty"] {
  set title p." arrivals"
  f = dir."/queue_".p.".csv"
  plot for [s in "rrc fifo gshare"] f skip 1 using 2:(strcol(1) eq s ? $6 : 1/0) \
       with linespoints lw 2 pt 7 title s
}
unset multiplot
