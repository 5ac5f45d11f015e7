# Fig. 12: p90 (bars) and p98 (whiskers) of DenseNet-201 and Bert-qa, heaviness vs LRU, for
# pools of 70% and 80% of the models' footprint; circles mark the deadlines.
load "common.gp"
set terminal pngcairo size 900,420 font ",9" noenhanced
set output out
set title "Fig. 12: tail latency, heaviness-aware eviction vs LRU (bars p90, whiskers p98)"
set ylabel "latency (ms)"
set style fill solid 0.6 border -1
set boxwidth 0.6
set key off
set xrange [-0.6:7.6]
set yrange [0:*]
set xtics rotate by -25
set bmargin 7
set rmargin 12
f = dir."/fig12.csv"
plot f skip 1 using 0:4:xtic(strcol(3)." ".strcol(2)." ".strcol(1)."%") with boxes lc rgb "#4477aa", \
     f skip 1 using 0:4:4:5 with yerrorbars lc rgb "black" pt 0, \
     f skip 1 using 0:6 with points pt 6 ps 1.5 lc rgb "#cc3311"
