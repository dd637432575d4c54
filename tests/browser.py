"""A headless browser (Chromium) that lays out built pages at a given
window width and reports what it cannot show whole: a code block or table
that needs a scroll bar or is cut by a box around it, and anything wider
than the window.  Used by the documentation site's tests.

One bounded Chromium run per page (--dump-dom): a script added to a copy
of the page measures the layout once it has loaded and writes its findings
into the DOM that Chromium prints.  Nothing but Chromium is needed."""
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile

BROWSERS = ("chromium", "chromium-browser", "google-chrome")

# Runs in the page once it has loaded (images and fonts laid out), and
# writes its findings into the DOM, which --dump-dom prints.
CHECK = r"""
window.addEventListener("load", () => {
  const vw = document.documentElement.clientWidth;
  const found = [];
  for (const el of document.querySelectorAll("pre, table, img")) {
    const r = el.getBoundingClientRect();
    if (r.width === 0) continue;                       // not shown (a closed drawer)
    const what = el.tagName.toLowerCase() + " '" +
      (el.tagName === "IMG" ? el.getAttribute("src")
                            : el.textContent.trim().replace(/\s+/g, " ").slice(0, 50)) + "'";
    if (el.scrollWidth > el.clientWidth + 1)
      found.push(`${what}: needs ${el.scrollWidth} px, shows ${el.clientWidth} px`);
    if (r.right > vw + 1)
      found.push(`${what}: ends at ${Math.round(r.right)} px, the window at ${vw} px`);
    for (let a = el.parentElement; a && a !== document.documentElement; a = a.parentElement) {
      const ar = a.getBoundingClientRect();
      if (getComputedStyle(a).overflowX !== "visible" && r.right > ar.right + 1) {
        found.push(`${what}: cut at ${Math.round(ar.right)} px by <${a.tagName.toLowerCase()}` +
                   ` class="${a.className}"> (ends at ${Math.round(r.right)} px)`);
        break;
      }
    }
  }
  const images = [...document.querySelectorAll("img")].map((el) => ({
    src: el.getAttribute("src"), shown: el.getBoundingClientRect().width,
    natural: el.naturalWidth}));
  const out = document.createElement("script");
  out.type = "application/json";
  out.id = "layout-report";
  out.textContent = JSON.stringify({width: vw, checked:
    document.querySelectorAll("pre, table").length, clipped: found, images})
    .replace(/</g, "\u003c");                 // so that no closing tag is inside
  document.body.appendChild(out);
});
"""


def find_browser():
    """The path of a Chromium, or None."""
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def layout_report(browser, page, width=1280, height=900, timeout=60):
    """Lay out `page` (a built .html file) at `width` px; return the report:
    {"width": the layout width, "checked": code blocks and tables seen,
    "clipped": what is not shown whole, "images": each image's src and
    its shown and natural widths}.  The page is copied beside
    itself with the check added, so the site is left as built."""
    with open(page) as f:
        html = f.read()
    probe = os.path.join(os.path.dirname(page), "_layout_" + os.path.basename(page))
    with open(probe, "w") as f:
        f.write(html.replace("</body>", f"<script>{CHECK}</script></body>", 1))
    # Its own process group: a run that overstays is killed with every
    # process Chromium started; its own profile, removed after.
    profile = tempfile.mkdtemp(prefix="pyshmlock-chromium-")
    proc = subprocess.Popen(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-extensions",
         "--no-first-run", "--hide-scrollbars", f"--user-data-dir={profile}",
         f"--window-size={width},{height}", "--virtual-time-budget=10000", "--dump-dom",
         "file://" + probe],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    finally:
        os.unlink(probe)
        shutil.rmtree(profile, ignore_errors=True)
    m = re.search(r'<script type="application/json" id="layout-report">(.*?)</script>',
                  stdout, re.S)
    assert m, f"{browser} gave no layout report for {page} " \
              f"(exit {proc.returncode}):\n{stderr[-3000:]}"
    return json.loads(m.group(1))
