# Shared by every plot: PNG output (pngcairo, which gnuplot-nox ships), CSV input. Run from this
# folder with `dir` (the CSV folder) and `out` (the PNG) set:
#   gnuplot -e "dir='/abs/csv'; out='/abs/fig10.png'" fig10.gp
set terminal pngcairo size 720,420 font ",10" noenhanced
set output out
set datafile separator ","
set grid ytics lc rgb "#dddddd"
set border 3
set tics nomirror
set key top right
