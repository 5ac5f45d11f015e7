# Caching policies: hit ratio (left) and mean load time (right) against capacity.
load "common.gp"
set terminal pngcairo size 900,400 font ",10" noenhanced
set output out
set multiplot layout 1,2
set xlabel "capacity (% of all models)"
set xtics (40, 60, 80)
set xrange [35:85]
set key bottom right font ",8"
f = dir."/caching.csv"
policies = "lfu lru random mcache cremebrulee heaviness belady cremebrulee-oracle"
set title "hit ratio"
set ylabel "hit ratio"
plot for [s in policies] f skip 1 using 1:(strcol(2) eq s ? $3 : 1/0) with linespoints lw 2 title s
set title "mean load time per request"
set ylabel "ms"
set key top right font ",8"
plot for [s in policies] f skip 1 using 1:(strcol(2) eq s ? $4 : 1/0) with linespoints lw 2 title s
unset multiplot
