"""Summarise an A/B of maintenance_bench CSVs: per shape and delta, median IMP ms and median ratio."""
import csv, sys, statistics as st, collections
d = sys.argv[1]; sides = sys.argv[2].split(","); rounds = sys.argv[3].split(",")
data = collections.defaultdict(list)
order = []
for side in sides:
    for r in rounds:
        for row in csv.DictReader(open(f"{d}/{side}-{r}.csv")):
            key = (row["shape"], int(row["delta_rows"]))
            if key not in order: order.append(key)
            data[side, r, key].append((float(row["imp_ms"]), float(row["recapture_ms"])))
hdr = "| shape | delta rows | " + " | ".join(f"{s} round {r}" for r in rounds for s in sides) + " |"
print(hdr); print("|---|---:|" + "---:|" * (len(sides) * len(rounds)))
for key in order:
    cells = []
    for r in rounds:
        for s in sides:
            v = data[s, r, key]
            imp = st.median(x for x, _ in v); ratio = st.median(y / x for x, y in v)
            cells.append(f"{imp:.2f} ms ({ratio:.0f}×)")
    print(f"| {key[0]} | {key[1]:,} | " + " | ".join(cells) + " |")
