"""Looks at the built site as a reader would, in headless Chromium.

    python docs/check_site.py [OUT]    # OUT: where the screenshots go (build/site-check)

Builds the site (`mkdocs build --strict`), then renders the home page and the
optimizers' API page with Debian's `chromium` (apt-get install chromium),
checks the text a reader sees (the title, the quick start, the LARS class
heading and its arguments) and saves a screenshot of each for a person to
look at. Not run by CI: installing Chromium would take most of the docs
stage's minute; CI builds the site strictly and tests/test_site.py checks the
API pages.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# page -> texts its rendered DOM must hold
PAGES = {
    "index.html": ["<title>keras_lars</title>", "Quick start", "Large-batch training for Keras 3"],
    "api/optimizers/index.html": [
        "<title>Optimizers - keras_lars</title>",
        "keras_lars.LARS",
        "keras_lars.LAMB",
        "trust_coefficient",
    ],
}


def chromium(*args):
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        sys.exit("error: no chromium: apt-get install chromium")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,900"]
    done = subprocess.run([binary, *flags, *args], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        sys.exit(f"error: chromium exited {done.returncode}: {done.stderr[-500:]}")
    return done.stdout


def main(out):
    site = tempfile.mkdtemp(prefix="keras_lars_site_")
    subprocess.run(["mkdocs", "build", "--strict", "-q", "-d", site], cwd=ROOT, check=True)
    os.makedirs(out, exist_ok=True)
    missing = []
    for page, texts in PAGES.items():
        url = "file://" + os.path.join(site, page)
        dom = chromium("--dump-dom", url)
        missing += [f"{page}: {text!r} not shown" for text in texts if text not in dom]
        shot = os.path.join(out, re.sub(r"\W+", "_", page.removesuffix(".html")) + ".png")
        chromium(f"--screenshot={shot}", url)
        print(f"{page}: {len(dom):,} characters of DOM, screenshot {shot}")
    shutil.rmtree(site)
    for line in missing:
        print("error:", line)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "site-check")))
