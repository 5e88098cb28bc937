#!/usr/bin/env bash
# Screenshots of each kind of HTML report for docs/reports.md, made from
# small simulator sweeps (a few minutes on two cores):
#
#   scripts/report_screenshots.sh            write docs/img/report-*.png
#
# report    `hbench report` of a sweep (2 organizations x 2 budgets x 3 seeds,
#           80 requests at 2 req/s) plus a capacity search under the same root
# analyze   `hbench analyze`'s analysis/report.html of that sweep
# capacity  `hbench capacity`'s report.html
# reproduce `hbench reproduce q4 --quick`'s analysis/report.html
#
# Each page is rendered by headless Chromium at 1200 x 1000 CSS pixels (the
# first screen: the question, the answers and what limits them) and reduced
# to a 64-colour palette, 1200 pixels wide, so the four stay small.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python}"
CHROMIUM="${CHROMIUM:-$(command -v chromium || command -v chromium-browser)}"
JOBS="${JOBS:-2}"
OUT=docs/img
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT"

hb() { "$PYTHON" -m hbench.cli "$@"; }

hb sweep --org s2,d0 --budget b83,b108 --rate 2 --seeds 1-3 --requests 80 --jobs "$JOBS" \
    --out "$WORK/root/sweep" >/dev/null
hb capacity --org s2,d0 --budget b63,b108 --rates 1,2,4 --seeds 1-3 --requests 60 --set cap=63 \
    --jobs "$JOBS" \
    --slo 'ttft_p99<=2s,tpot_p99<=100ms' --out "$WORK/root/capacity" >/dev/null
hb report "$WORK/root" -o "$WORK/report.html" >/dev/null
hb analyze "$WORK/root/sweep" --out "$WORK/analysis" --no-figures >/dev/null
hb reproduce q4 --quick --jobs "$JOBS" --no-figures --out "$WORK/reproduce" >/dev/null

shot() {  # shot NAME HTML
    "$CHROMIUM" --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run \
        --user-data-dir="$WORK/profile-$1" --window-size=1200,1000 --virtual-time-budget=10000 \
        --screenshot="$WORK/$1.png" "file://$(realpath "$2")" >/dev/null 2>&1
    "$PYTHON" - "$WORK/$1.png" "$OUT/report-$1.png" <<'EOF'
import sys
from PIL import Image

im = Image.open(sys.argv[1]).convert("RGB")
im.quantize(colors=64, method=Image.Quantize.FASTOCTREE).save(sys.argv[2], optimize=True)
EOF
}

shot report "$WORK/report.html"
shot analyze "$WORK/analysis/report.html"
shot capacity "$WORK/root/capacity/report.html"
shot reproduce "$WORK/reproduce/q4-quick/analysis/report.html"
du -cb "$OUT"/report-*.png
