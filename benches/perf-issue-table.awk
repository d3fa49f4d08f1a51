# Issue 15's table from the files of one benches/run-perf-issue.sh run, every figure as the
# ratio its goal is stated in: median over the runs, each run's value, the goal, met or not.
# Usage: awk -f perf-issue-table.awk OUT/soft_vs_cma.txt OUT/proxy.txt OUT/ibnet-perf.txt
# Portable awk (mawk or gawk: no asort, no gensub).

function median(s,    n, a, i, j, t) {
  n = split(s, a, " ")
  if (n == 0) return ""
  for (i = 2; i <= n; i++) {
    t = a[i] + 0
    for (j = i - 1; j >= 1 && a[j] + 0 > t; j--) a[j + 1] = a[j]
    a[j + 1] = t
  }
  return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
# "8B", "16KiB", "1MiB", or "4 KiB" with the unit as a second word: bytes.
function bytes(v, u) {
  v = v u
  if (v ~ /KiB$/) return (v + 0) * 1024
  if (v ~ /MiB$/) return (v + 0) * 1048576
  if (v ~ /GiB$/) return (v + 0) * 1073741824
  return v + 0
}
function after(word,    i) {
  for (i = 1; i < NF; i++) if ($i == word) return $(i + 1) + 0
  return ""
}
function row(name, vals, goal, op, bound,    m) {
  m = median(vals)
  if (m == "") { printf "%-46s %8s   %-26s %-9s %s\n", name, "-", "(missing)", goal, "?"; return }
  ok = (op == "<=") ? (m <= bound) : (m >= bound)
  verdict = (op == "") ? "" : ok ? "met" : "NOT MET"
  printf "%-46s %8.2f   %-26s %-9s %s\n", name, m, vals, goal, verdict
  if (op != "" && !ok) missed++
}
function add(arr, key, v) { arr[key] = (key in arr) ? arr[key] " " v : v }

FNR == 1 { file++ }
# ---- soft_vs_cma.txt (REPS runs, each "#### run N")
file == 1 && /^#### run/ { sec = "" }
file == 1 && /raw process_vm_writev, one call/ { add(rawcall, 1, $(NF - 1)) }
file == 1 && /soft WRITE_WITH_IMM one-way \(RTT\/2\)/ && /ratio/ { add(prov, 1, after("ratio")) }
file == 1 && /^provider one-way latency per size/ { sec = "lat" }
# One raw process_vm_writev of the size (p50): the raw CMA time of that size.
file == 1 && sec == "lat" && $2 ~ /^(B|KiB|MiB)$/ && NF >= 6 { add(rawone, bytes($1, $2), $3) }
file == 1 && /^bandwidth/ { sec = "prov" }
file == 1 && /^ibnet comms/ { sec = "comm" }
file == 1 && /^in-process/ { sec = "" }
file == 1 && sec == "prov" && $2 ~ /^(KiB|MiB)$/ && NF == 5 {
  s = bytes($1, $2); add(rawbw, s, $3); sizes[s] = $1 " " $2
}
file == 1 && sec == "comm" && /8 B one-way/ { add(comm8, 1, after("ratio")) }
file == 1 && sec == "comm" && /\(w=/ { s = bytes($1, $2); add(commbw, s, $NF) }
# ---- proxy.txt
file == 2 && /proxy summary/ {
  k = $3 " " $4; add(pthr, k, after("throughput")); add(povh, k, after("overhead")); pk[k] = 1
}
# ---- ibnet-perf.txt
file == 3 && /^│ *[0-9]/ {
  line = $0; gsub(/│/, " ", line); split(line, f, " ")
  n++; lsize[n] = bytes(f[1], ""); lname[n] = f[1]; lp50[n] = f[2] + 0; lp99[n] = f[3] + 0
}

END {
  printf "%-46s %8s   %-26s %-9s %s\n", "figure (issue 15)", "median", "runs", "goal", ""
  row("provider 8 B one-way / one raw call", prov[1], "<= 1.5", "<=", 1.5)
  row("comm 8 B one-way / one raw call", comm8[1], "<= 2", "<=", 2)
  for (s = 4096; s <= 67108864; s *= 4) {
    if (!(s in commbw)) continue
    g = (s >= 1048576) ? 1.5 : 0.9
    row("comm bandwidth / raw CMA, " sizes[s], commbw[s], ">= " g, ">=", g)
  }
  for (k in pk) if (k ~ / 8$/) {
    row("proxy engine/bare throughput, " k " B", pthr[k], ">= 0.9", ">=", 0.9)
    row("proxy engine overhead ns/step, " k " B", povh[k], "<= 30", "<=", 30)
  }
  for (k in pk) if (k !~ / 8$/) row("proxy engine/bare throughput, " k " B", pthr[k], "(info)", "", 0)
  call = median(rawcall[1])
  printf "\nibnet-perf p50 / (raw CMA time of the size + one raw 8 B call %.2f us); goal <= 1.5, and\n", call
  printf "p50 / p50 of half the size <= 2.2 (doubling the size at most doubles the time), or at most\n"
  printf "the raw call's own step between the two sizes (raw x): a step over both is a CLIFF\n"
  printf "raw us: p50 of one raw process_vm_writev of the size (call; soft_vs_cma's per-size table),\n"
  printf "else the size / raw CMA bandwidth of the largest measured size below it (bw)\n"
  printf "  %-8s %9s %9s %9s %-4s %9s %7s %7s %7s\n", "size", "p50 us", "p99 us", "raw us", "src", "bound us", "ratio", "x prev", "raw x"
  for (i = 1; i <= n; i++) {
    # Raw CMA bandwidth of the largest measured size <= this one (the smallest below 4 KiB).
    bw = ""; for (s = 4096; s <= 67108864; s *= 4) if ((s in rawbw) && (s <= lsize[i] || bw == "")) bw = median(rawbw[s])
    tb = (bw > 0) ? lsize[i] / (bw * 1000) : 0
    if (lsize[i] in rawone) { t = median(rawone[lsize[i]]); src = "call" } else { t = tb; src = "bw" }
    r = lp50[i] / (t + call)
    if (lp50[i] / (tb + call) > 1.5) bwmiss++
    step = (i > 1 && lp50[i - 1] > 0) ? lp50[i] / lp50[i - 1] : 0
    # The raw call's own step between the same sizes (both measured as one call).
    rstep = (i > 1 && src == "call" && psrc == "call" && pt > 0) ? t / pt : 0
    flag = (r > 1.5 ? " over" : "") (step > 2.2 ? (step > rstep ? " CLIFF" : " step<=raw") : "")
    if (r > 1.5) lmiss++
    if (step > 2.2) steps++
    if (step > 2.2 && step > rstep) cliffs++
    pt = t; psrc = src
    printf "  %-8s %9.2f %9.2f %9.2f %-4s %9.2f %7.2f %7.2f %7.2f%s\n", lname[i], lp50[i], lp99[i], t, src, 1.5 * (t + call), r, step, rstep, flag
  }
  printf "latency rows over the bound: %d of %d; steps over 2.2: %d, of which cliffs (more than the raw call's own step): %d\n", lmiss, n, steps, cliffs
  printf "(rows over with every raw time taken as size / bandwidth, the formula before session 5: %d)\n", bwmiss
  printf "table figures not met: %d\n", missed
}
