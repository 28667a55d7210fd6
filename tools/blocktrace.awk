# blocktrace.awk turns a block I/O trace in libCacheSim's CSV layout (version,time,op,size,lbn;
# its data/cloudPhysicsIO.csv) into a trace for `slicectl sim --trace`: one key per block
# ("b" + its number), its load the requests to it in each epoch of W time units, set to 0 in
# the first epoch without any. Requests must come in time order.
#
#   awk -v W=360 -f tools/blocktrace.awk cloudPhysicsIO.csv > cp360.jsonl
BEGIN { FS = "," }
NR == 1 { next }
NR == 2 { t0 = $2 }
{
  e = int(($2 - t0) / W)
  if (e != cur) { flush(); cur = e }
  n[$5]++
}
END { flush() }
function flush(   k) {
  for (k in last) if (!(k in n) && last[k] > 0) { printf "{\"epoch\":%d,\"key\":\"b%s\",\"load\":0}\n", cur, k; last[k] = 0 }
  for (k in n) { if (last[k] != n[k]) printf "{\"epoch\":%d,\"key\":\"b%s\",\"load\":%d}\n", cur, k, n[k]; last[k] = n[k] }
  delete n
}
