#!/usr/bin/env python
"""Screenshots of the dashboard's pages for the README, taken from a running demo with real traffic.

    TESSERA_ADMIN_PASSWORD=... .venv/bin/tessera demo &          # the control plane, agents, router
    .venv/bin/python scripts/dashboard_screenshots.py --password ... [--out docs/img]

Sends requests to every demo application through the demo's router for `--traffic-s` seconds (the GPU
applications answer from simulated runtimes, labelled so; the CPU one computes with onnxruntime), then
drives Debian's Chromium (/usr/bin/chromium) with Playwright as the admin: overview, fleet, applications,
policies, plans, the newest validated plan (approved and applied), and its rollout job. Writes
dashboard-<page>.png into --out."""
from __future__ import annotations

import argparse
import random
import threading
import time
from pathlib import Path

import httpx

APPLICATIONS = {  # the demo's applications, their share of the traffic and an input each accepts
    "classify-resnet": (0.3, {"inputs": [{"name": "images", "shape": [1, 1], "datatype": "FP32", "data": [0.5]}]}),
    "classify-mobile": (0.3, {"inputs": [{"name": "images", "shape": [1, 1], "datatype": "FP32", "data": [0.5]}]}),
    "classify-densenet": (0.15, {"inputs": [{"name": "images", "shape": [1, 1], "datatype": "FP32", "data": [0.5]}]}),
    "classify-vgg": (0.15, {"inputs": [{"name": "images", "shape": [1, 1], "datatype": "FP32", "data": [0.5]}]}),
    "tabular-cpu": (0.1, {"inputs": [{"name": "input", "shape": [1, 8], "datatype": "FP32", "data": [0.5, -1.2, 0.3, 2.0, -0.7, 0.1, 1.5, -0.4]}]}),
}


def traffic(router: str, rate: float, stop: threading.Event) -> None:
    """Poisson arrivals at `rate` requests/s in all, split by APPLICATIONS' shares; each request in a thread."""
    names = list(APPLICATIONS)
    weights = [APPLICATIONS[n][0] for n in names]
    client = httpx.Client(timeout=5)

    def send(name: str) -> None:
        try:
            client.post(f"{router}/v1/infer/{name}", json=APPLICATIONS[name][1])
        except httpx.HTTPError:
            pass

    while not stop.is_set():
        time.sleep(random.expovariate(rate))
        threading.Thread(target=send, args=(random.choices(names, weights)[0],), daemon=True).start()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--router", default="http://127.0.0.1:8100")
    parser.add_argument("--user", default="admin")
    parser.add_argument("--password", required=True)
    parser.add_argument("--rate", type=float, default=120.0, help="requests/s through the router, all applications")
    parser.add_argument("--traffic-s", type=float, default=40.0, help="traffic before the first screenshot")
    parser.add_argument("--out", type=Path, default=Path("docs/img"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    from playwright.sync_api import sync_playwright

    stop = threading.Event()
    threading.Thread(target=traffic, args=(args.router, args.rate, stop), daemon=True).start()
    print(f"sending {args.rate:g} requests/s through {args.router} for {args.traffic_s:g} s...")
    time.sleep(args.traffic_s)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(30_000)
        page.goto(f"{args.url}/login/")
        page.fill("#id_username", args.user)
        page.fill("#id_password", args.password)
        page.click("form button[type=submit]")
        page.wait_for_load_state()

        def shot(name: str, path: str, *, live: bool = False, full_page: bool = True, wait: str | None = None) -> None:
            if path:
                page.goto(f"{args.url}{path}")
            if live:
                page.wait_for_selector('body[data-live-state="open"]')
                time.sleep(2.5)  # a few live updates
            if wait:
                page.wait_for_selector(wait)
            page.screenshot(path=str(args.out / f"dashboard-{name}.png"), full_page=full_page)
            print(f"wrote {args.out / f'dashboard-{name}.png'}")

        shot("overview", "/overview/", live=True)
        shot("fleet", "/fleet/", live=True)
        shot("applications", "/applications/")
        shot("policies", "/policies/")
        shot("plans", "/plans/", live=True)
        validated = page.locator('tr[data-plan]:has(.status-validated) a').first
        if validated.count():
            validated.click()
            page.wait_for_load_state()
            shot("plan", "", live=True)
            page.click("button[name=approve]")
            page.wait_for_selector('[data-plan-status="approved"]')
            page.click("button[name=apply]")
            page.wait_for_url("**/jobs/*/")
            shot("job", "", wait='[data-job-status="succeeded"], [data-job-status="failed"]')
        else:
            print("no validated plan to show (the planning watch makes one when demand changes)")
        browser.close()
    stop.set()


if __name__ == "__main__":
    main()
