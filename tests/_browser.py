"""Open a page in Debian's headless Chromium (through chromedriver) and report its images."""
from __future__ import annotations

import os
import shutil
import tempfile

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"

# Without the networking flags Chromium keeps trying to reach Google on a closed network.
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1200,1800"]


def available() -> bool:
    return os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)


def images(path: str, screenshot: str | None = None) -> list[dict]:
    """Every <img> on the page after load: alt text, whether it loaded, natural size."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="chromium-")
    for flag in FLAGS + [f"--user-data-dir={profile}"]:
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    try:
        driver.get("file://" + os.path.abspath(path))
        found = driver.execute_script(
            "return Array.from(document.images).map(i => ({alt: i.alt, complete: i.complete,"
            " width: i.naturalWidth, height: i.naturalHeight, src: i.src.slice(0, 22)}))")
        if screenshot:
            driver.save_screenshot(screenshot)
        return found
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
