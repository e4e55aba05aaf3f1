import re, statistics, sys
def added(f):
    out = {}
    for line in open(f):
        m = re.match(r"\| (unchanged|after a write) \| (simple|extended) \| [\d.]+ \| [\d.]+ \| \+?(-?[\d.]+) \|", line)
        if m:
            out[(m.group(1), m.group(2))] = float(m.group(3))
    return out
rows = {}
for i in range(1, 9):
    a = added(f"after-{i}.md"); b = added(f"before-{i}.md")
    for k in a:
        rows.setdefault(k, []).append((b[k], a[k], round(a[k] - b[k], 3)))
for k, v in rows.items():
    print(k, "before med", statistics.median(x[0] for x in v), "after med", statistics.median(x[1] for x in v),
          "diffs", [x[2] for x in v], "median diff", round(statistics.median(x[2] for x in v), 3))
