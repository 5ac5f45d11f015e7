# Fig. 14b: latency / deadline quantiles (left) and per-node GPU load variance (right).
load "common.gp"
set terminal pngcairo size 900,400 font ",10" noenhanced
set output out
set multiplot layout 1,2
set title "2500 functions: latency / deadline (quantiles 1/128 ... 127/128)"
# x: the quantile on a logit scale, so 1/128 ... 1/2 ... 127/128 are evenly spaced (the
# paper's boxes).
logit(q) = log(q / (1 - q))
set xlabel "quantile"
set xtics ("1/128" logit(1/128.), "1/32" logit(1/32.), "1/8" logit(1/8.), "1/2" 0, \
           "7/8" logit(7/8.), "31/32" logit(31/32.), "127/128" logit(127/128.))
set ylabel "latency / deadline"
set logscale y
set key top left
f = dir."/fig14b_latency.csv"
plot for [s in "hiber simpleswap nonswap"] f skip 1 using (logit($3)):(strcol(1) eq "2500" && strcol(2) eq s ? $4 : 1/0) \
     with linespoints lw 2 pt 7 title s, 1 with lines dt 2 lc rgb "gray" notitle
unset logscale
set xtics autofreq
set title "2500 functions: per-node variance of GPU load / node max"
set xlabel "node"
set ylabel "variance"
set yrange [0:*]
g = dir."/fig14b_variance.csv"
plot for [s in "hiber simpleswap nonswap"] g skip 1 using 3:(strcol(1) eq "2500" && strcol(2) eq s ? $4 : 1/0) \
     with linespoints lw 2 pt 7 title s
unset multiplot
