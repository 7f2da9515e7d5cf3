#!/usr/bin/env bash
# ftplan report and ftplan sweep --format svg ("Speak the user's stack", item 4), tested in a real
# browser: the page for a 70B job with tensor/pipeline compositions is one well-formed file with no
# script and nothing to fetch; Debian's headless chromium renders it; the screenshot is not blank
# (pixels of the memory bars' colours are counted in the PNG, decoded here with zlib) and the page
# logs nothing to the console (a CSP violation, a failed load or a script error would). Two
# scratch pages prove those checks can fail: one logging a deliberate error, one blank.
# Without chromium the browser part is skipped (exit 77) locally and fails under CI (CI=true), where
# scripts/setup.sh installs it. FTPLAN_REPORT_KEEP=DIR keeps the report and its screenshot there.
# Usage: bash report.sh <path-to-ftplan>
SCRIPT=report.sh
source "$(dirname "$0")/lib/harness.sh"

JOB70=(--model llama-3.1-70b --method full --gpu h100-sxm --gpus 32 --seq-len 4096 --dataset-tokens 100000000
       --framework torchtitan)
TINY="$FTPLAN_DATA_DIR/configs/jobs/tinyllama-lora-4x-rtx6000ada.json"

# ---- the files, without a browser ---------------------------------------------------------------
"$FTPLAN" report "${JOB70[@]}" -o "$TMP/report.html" >"$TMP/out" 2>"$TMP/err" ||
  fail "report of the 70B job: exit $?: $(cat "$TMP/err")"
"$FTPLAN" report "${JOB70[@]}" --parallel tp=4,pp=4,dp_shard=2 --grad-accum 8 -o "$TMP/pp.html" 2>"$TMP/err" ||
  fail "report of tp=4,pp=4,dp_shard=2: exit $?: $(cat "$TMP/err")"
"$FTPLAN" report "$TINY" --gpu-types rtx-4090,l4 --gpu-counts 1,2 -o "$TMP/tiny.html" 2>"$TMP/err" ||
  fail "report of $TINY: exit $?: $(cat "$TMP/err")"
[ -s "$TMP/out" ] && fail "report printed to stdout with -o: $(head -c 200 "$TMP/out")"

# Structure: XML-parseable, the CSP, no script, no src, links in-page only, the four charts with
# their units, a bar per strategy (compositions included), the assumptions.
check_page() {  # file, expected pipeline stages in the timeline (0: do not check)
  python3 - "$1" "$2" <<'PY'
import re, sys, xml.etree.ElementTree as ET
path, stages = sys.argv[1], int(sys.argv[2])
text = open(path, encoding="utf-8").read()
problems = []
if not text.startswith("<!DOCTYPE html>"): problems.append("no <!DOCTYPE html>")
try:
    root = ET.fromstring(text.replace("<!DOCTYPE html>", "", 1))
except ET.ParseError as e:
    print("not well-formed: %s" % e); sys.exit(1)
SVG = "{http://www.w3.org/2000/svg}"
def all_text(e): return "".join(e.itertext())
metas = [m for m in root.iter("meta") if m.get("http-equiv") == "Content-Security-Policy"]
if not metas or metas[0].get("content") != "default-src 'none'; style-src 'unsafe-inline'":
    problems.append("no CSP forbidding fetches")
if list(root.iter("script")): problems.append("a <script>")
if re.search(r"\ssrc\s*=", text): problems.append("a src= attribute")
for a in root.iter("a"):
    if not a.get("href", "").startswith("#"): problems.append("a link out: %s" % a.get("href"))
urls = set(re.findall(r"https?://[^\"' <)]+", text)) - {"http://www.w3.org/2000/svg"}
if re.search(r"url\(", text) or any(u for u in urls if re.search(r'(href|src)=["\']?' + re.escape(u), text)):
    problems.append("an external reference")
svgs = list(root.iter(SVG + "svg"))
classes = [s.get("class") for s in svgs]
if classes != ["chart stacked-bars", "chart scatter", "chart timeline", "chart step-lines"]:
    problems.append("charts %s" % classes)
body = all_text(root)
for needle in ["memory per GPU (GiB)", "job time (h)", "job cost (USD)", "time into the step (s)",
               "memory in use per GPU (GiB)", "memory metric predicted", "framework torchtitan",
               "NVIDIA H100 80GB SXM5", "USD per GPU-hour", "GiB = 2^30 bytes"]:
    if needle not in body: problems.append("no '%s'" % needle)
if not re.search(r"read 20\d\d-\d\d", body): problems.append("no dated price")
# One bar group per row of the plan's strategy table, compositions like tp=2,dp_shard=16 included.
groups = [g.get("data-category") for g in svgs[0].iter(SVG + "g") if g.get("class") == "bar-group"] if svgs else []
plan_rows = [tr.findall("td")[0].text for tr in root.find(".//section[@id='plan']").iter("tr") if tr.findall("td")]
if groups != plan_rows: problems.append("bars %s vs plan rows %s" % (groups, plan_rows))
if not any("," in g for g in groups): problems.append("no composition among the bars: %s" % groups)
for g in svgs[0].iter(SVG + "g") if svgs else []:
    if g.get("class") != "bar-group": continue
    if not [r for r in g.iter(SVG + "rect") if "bar" in r.get("class", "").split()]:
        problems.append("bar %s has no segment" % g.get("data-category"))
# Frontier: highlighted points = the frontier table's rows.
if len(svgs) > 1:
    hi = [c for c in svgs[1].iter(SVG + "circle") if "highlighted" in c.get("class", "").split()]
    table = root.find(".//section[@id='frontier']/table")
    rows = [tr for tr in table.iter("tr") if tr.findall("td")] if table is not None else []
    if not hi or len(hi) != len(rows): problems.append("%d highlighted points, %d frontier rows" % (len(hi), len(rows)))
if stages and len(svgs) > 2:
    lanes = {g.get("data-lane") for g in svgs[2].iter(SVG + "g") if g.get("class") == "lane"}
    ranks = {l.split()[1] for l in lanes}
    if len(ranks) != stages: problems.append("timeline ranks %s, expected %d stages" % (sorted(ranks), stages))
print("; ".join(problems))
sys.exit(1 if problems else 0)
PY
}
for page in report pp; do
  [ -s "$TMP/$page.html" ] || continue
  stages=0
  [ "$page" = pp ] && stages=4
  out=$(check_page "$TMP/$page.html" "$stages") || fail "$page.html: $out"
done
# The small job's page: same structure (a hf job: its framework named), smaller sweep.
if [ -s "$TMP/tiny.html" ]; then
  grep -q "framework hf" "$TMP/tiny.html" || fail "tiny.html does not name its framework"
  grep -q 'class="chart scatter"' "$TMP/tiny.html" || fail "tiny.html has no frontier"
fi

# sweep --format svg: a standalone SVG whose highlighted points are exactly the time-cost frontier
# of the same sweep's JSON rows, worked out here.
SWEEP=(sweep "$TINY" --gpu-types a100-80gb-sxm,rtx-4090,l4 --gpu-counts 1,2,4)
"$FTPLAN" "${SWEEP[@]}" --format svg >"$TMP/frontier.svg" 2>"$TMP/err" || fail "sweep --format svg: exit $?: $(cat "$TMP/err")"
"$FTPLAN" "${SWEEP[@]}" --format json >"$TMP/sweep.json" 2>"$TMP/err" || fail "sweep --format json: exit $?"
out=$(python3 - "$TMP/frontier.svg" "$TMP/sweep.json" <<'PY'
import json, sys, xml.etree.ElementTree as ET
SVG = "{http://www.w3.org/2000/svg}"
text = open(sys.argv[1], encoding="utf-8").read()
if not text.startswith('<?xml version="1.0" encoding="UTF-8"?>'): print("no XML declaration"); sys.exit(1)
root = ET.fromstring(text.encode("utf-8"))
rows = json.load(open(sys.argv[2]))
points = [c for c in root.iter(SVG + "circle") if "point" in c.get("class", "").split()]
hi = [c for c in points if "highlighted" in c.get("class", "").split()]
# The frontier: rows no other row beats on both job time and cost; one of identical rows.
pts = sorted({(r["job_time_s"], r["cost_usd"]) for r in rows})
frontier, best = [], float("inf")
for t, c in pts:
    if c < best: frontier.append((t, c)); best = c
problems = []
drawn = sum(int(c.get("data-count")) for c in points)  # one circle per spot, counting its plans
if drawn != len(rows): problems.append("%d points for %d rows" % (drawn, len(rows)))
if len(hi) != len(frontier): problems.append("%d highlighted, frontier has %d: %s" % (len(hi), len(frontier), frontier))
labels = "".join(root.itertext())
for needle in ("job time (h)", "job cost (USD)", "frontier"):
    if needle not in labels: problems.append("no '%s'" % needle)
print("; ".join(problems)); sys.exit(1 if problems else 0)
PY
) || fail "sweep --format svg: $out"

# Bad input: one line naming the flag, exit 2.
expect_2() {  # flag named, args...
  local flag=$1
  shift
  "$FTPLAN" "$@" >"$TMP/bad.out" 2>"$TMP/bad.err"
  local rc=$?
  [ "$rc" -eq 2 ] || fail "$* exited $rc, expected 2"
  grep -qF -- "$flag" "$TMP/bad.err" || fail "$*: stderr does not name $flag: $(cat "$TMP/bad.err")"
  [ "$(wc -l <"$TMP/bad.err")" -eq 1 ] || fail "$*: more than one line on stderr: $(cat "$TMP/bad.err")"
}
expect_2 "--output" report "$TINY"
expect_2 "--json" report "$TINY" --json -o "$TMP/x.html"
expect_2 "--gpu-counts" report "$TINY" --gpu-counts 1,zero -o "$TMP/x.html"
expect_2 "-o" report "$TINY" -o "$TMP/no/such/folder/x.html"
expect_2 "--objective" report "$TINY" --objective fastest -o "$TMP/x.html"
expect_2 "--format" sweep "$TINY" --format png

# ---- the browser --------------------------------------------------------------------------------
CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$CHROMIUM" ]; then
  if [ "${CI:-}" = true ]; then
    fail "chromium is not installed, and CI must run this test (scripts/setup.sh installs chromium)"
    echo "report.sh: $failures check(s) failed"
    exit 1
  else
    echo "report.sh: SKIP the browser checks: chromium is not installed (apt-get install chromium fonts-dejavu-core," \
         "or scripts/setup.sh)"
    [ "$failures" -ne 0 ] && { echo "report.sh: $failures check(s) failed"; exit 1; }
    exit 77
  fi
fi

# Renders $1 (a file) to $2.png (window $3, default 1400,6600: the whole report), the console log
# to $2.log and the DOM to $2.dom.
render() {
  local page=$1 name=$2 size=${3:-1400,6600}
  mkdir -p "$TMP/profile-$name"
  HOME=$TMP timeout 120 "$CHROMIUM" --headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars \
    --user-data-dir="$TMP/profile-$name" --no-first-run --disable-extensions --enable-logging=stderr --v=0 \
    --window-size="$size" --screenshot="$TMP/$name.png" "file://$page" >/dev/null 2>"$TMP/$name.log"
  local rc=$?
  HOME=$TMP timeout 120 "$CHROMIUM" --headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage --user-data-dir="$TMP/profile-$name" \
    --no-first-run --disable-extensions --dump-dom "file://$page" >"$TMP/$name.dom" 2>/dev/null
  return $rc
}
# What the page logged: console messages (errors, CSP violations, failed loads) and load failures.
console_errors() { grep -E 'CONSOLE|net::ERR_|Failed to load|Refused to' "$1" | head -n 5; }
# Not blank: > 3% of the pixels are not white, and the colours named ("r,g,b" ...) each cover >= 100 px.
png_check() {
  python3 - "$@" <<'PY'
import struct, sys, zlib
path, colors = sys.argv[1], [tuple(int(v) for v in c.split(",")) for c in sys.argv[2:]]
data = open(path, "rb").read()
if data[:8] != b"\x89PNG\r\n\x1a\n": print("not a PNG"); sys.exit(1)
pos, idat = 8, b""
while pos < len(data):
    n, = struct.unpack(">I", data[pos:pos + 4]); kind = data[pos + 4:pos + 8]; body = data[pos + 8:pos + 8 + n]
    pos += 12 + n
    if kind == b"IHDR":
        w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
        if depth != 8 or ctype not in (2, 6) or interlace: print("PNG type %d/%d not read here" % (depth, ctype)); sys.exit(1)
        bpp = 3 if ctype == 2 else 4
    elif kind == b"IDAT": idat += body
raw, stride = zlib.decompress(idat), w * bpp
prev, nonwhite, counts = bytearray(stride), 0, {c: 0 for c in colors}
for y in range(h):
    f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    if f == 1:
        for i in range(bpp, stride): line[i] = (line[i] + line[i - bpp]) & 255
    elif f == 2: line = bytearray((a + b) & 255 for a, b in zip(line, prev))
    elif f == 3:
        for i in range(stride): line[i] = (line[i] + ((line[i - bpp] if i >= bpp else 0) + prev[i]) // 2) & 255
    elif f == 4:
        for i in range(stride):
            a, b, c = (line[i - bpp] if i >= bpp else 0), prev[i], (prev[i - bpp] if i >= bpp else 0)
            p = a + b - c; pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    px = [tuple(line[i:i + 3]) for i in range(0, stride, bpp)]
    nonwhite += sum(1 for p in px if p != (255, 255, 255))
    for c in colors: counts[c] += px.count(c)
    prev = line
frac = nonwhite / float(w * h)
missing = ["%s: %d px" % (",".join(map(str, c)), n) for c, n in counts.items() if n < 100]
print("%dx%d, %.1f%% not white%s" % (w, h, 100 * frac, ("; colours missing: " + ", ".join(missing)) if missing else ""))
sys.exit(0 if frac > 0.03 and not missing else 1)
PY
}
WEIGHTS="78,121,167"    # #4e79a7: the weights term (and forward ops)
OPTIMIZER="225,87,89"   # #e15759: optimizer states
ACTIVATIONS="118,183,178"  # #76b7b2

# The checks can fail: a scratch page logging a deliberate error, and a blank page.
printf '<!DOCTYPE html><html><body><p>scratch</p><script>console.error("deliberate error from report.sh")</script></body></html>\n' \
  >"$TMP/scratch_error.html"
printf '<!DOCTYPE html><html><body></body></html>\n' >"$TMP/scratch_blank.html"
render "$TMP/scratch_error.html" scratch_error || fail "chromium failed on the scratch page: $(tail -n 3 "$TMP/scratch_error.log")"
[ -n "$(console_errors "$TMP/scratch_error.log")" ] ||
  fail "the console check missed a deliberate console.error: it cannot fail (chromium's log format changed?)"
grep -q "deliberate error from report.sh" "$TMP/scratch_error.log" || fail "the deliberate error is not in chromium's log"
render "$TMP/scratch_blank.html" scratch_blank || fail "chromium failed on the blank page"
out=$(png_check "$TMP/scratch_blank.png" "$WEIGHTS") && fail "the blank-screenshot check passed a blank page: $out"

# The reports.
for page in report pp; do
  [ -s "$TMP/$page.html" ] || continue
  render "$TMP/$page.html" "$page" || fail "chromium exit $? rendering $page.html: $(tail -n 3 "$TMP/$page.log")"
  errors=$(console_errors "$TMP/$page.log")
  [ -z "$errors" ] || fail "$page.html logged in the browser: $errors"
  [ -s "$TMP/$page.png" ] || { fail "no screenshot of $page.html"; continue; }
  out=$(png_check "$TMP/$page.png" "$WEIGHTS" "$OPTIMIZER" "$ACTIVATIONS") || fail "$page.png: $out"
  echo "report.sh: $page.png: $out"
  # The browser built the DOM the file describes: its four charts and their bars.
  svgs=$(grep -o '<svg ' "$TMP/$page.dom" | wc -l)
  [ "$svgs" -eq 4 ] || fail "$page.html: the browser's DOM holds $svgs <svg> elements, expected 4"
done
render "$TMP/frontier.svg" frontier 1000,580 || fail "chromium failed on frontier.svg"
[ -z "$(console_errors "$TMP/frontier.log")" ] || fail "frontier.svg logged: $(console_errors "$TMP/frontier.log")"
out=$(png_check "$TMP/frontier.png") || fail "frontier.png: $out"

if [ -n "${FTPLAN_REPORT_KEEP:-}" ]; then
  mkdir -p "$FTPLAN_REPORT_KEEP" && cp "$TMP"/report.html "$TMP"/report.png "$TMP"/pp.html "$TMP"/pp.png \
    "$TMP"/frontier.svg "$TMP"/frontier.png "$FTPLAN_REPORT_KEEP"/ 2>/dev/null
fi

if [ "$failures" -ne 0 ]; then
  echo "report.sh: $failures check(s) failed"
  exit 1
fi
echo "report.sh: all checks passed"
