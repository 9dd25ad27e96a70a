"""Never an answer from the wrong model (issue 16): a runtime refuses a query for a model it does not serve
(409 `wrong_model`, nothing run), and the router, whose table still routes an application to a slot that
now serves another, tries another instance of the same application or fails with 503 `no_route`; it never
relays another model's answer, not even from a runtime that does not check."""
from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from tests.onnx_builders import onnx_mlp_bytes
from tests.workers.dataplane_helpers import frame_call, runtime_spec, runtime_start
from tests.workers.test_router import TableSource, query, serve, table  # noqa: F401 (serve is a fixture)
from workers.wire import FrameParser, frame_pack, response_decode, response_encode

pytestmark = pytest.mark.timeout(300)

RESNET, MOBILE = "classify-resnet", "classify-mobile"


@pytest.fixture(scope="module")
def runtimes(tmp_path_factory):
    """Real onnxruntime processes: one slot serving classify-resnet/resnet50, two serving classify-mobile/mobilenet
    (the second one is the slot that moved: the resnet table below still routes to it)."""
    workdir = tmp_path_factory.mktemp("wrong-model")
    started = {}
    try:
        for name, application, variant, seed in (("resnet", RESNET, "resnet50", 1), ("mobile", MOBILE, "mobilenet", 2),
                                                 ("moved", MOBILE, "mobilenet", 2)):
            model = workdir / f"{name}.onnx"
            model.write_bytes(onnx_mlp_bytes(n_in=4, hidden=8, n_out=3, seed=seed))
            spec = runtime_spec(key=f"gpu0/{name}", application=application, variant=variant, instance=f"sim/gpu0/{name}",
                                artifact_path=str(model))
            started[name] = runtime_start(spec, workdir, name)
        yield started
    finally:
        for rt in started.values():
            rt.stop()


def route(rt, instance: str, variant: str, weight: float) -> dict:
    return {"instance": instance, "variant": variant, "weight": weight, "endpoint": rt.endpoint, "state": "ready"}


def infer_frame(**expects) -> dict:
    return {"op": "infer", "id": 1, "deadline_ms": 30_000.0, "content_type": "application/json", "header_length": None,
            "instance": "sim/gpu0/moved", "routing_version": 4, **expects}


def test_a_runtime_refuses_a_query_for_a_model_it_does_not_serve(runtimes) -> None:
    endpoint = runtimes["moved"].endpoint
    before = frame_call(endpoint, {"op": "health", "id": 0})[0]["counters"]
    for expects in ({"application": RESNET, "variant": "resnet50"}, {"application": RESNET}, {"application": MOBILE, "variant": "inception"}):
        header, body = frame_call(endpoint, infer_frame(**expects), query())
        assert header["status"] == 409 and header["code"] == "wrong_model", header
        assert header["application"] == MOBILE and header["variant"] == "mobilenet"
        assert b"serves classify-mobile/mobilenet" in body and b"outputs" not in body
    # Nothing ran: no arrival, no batch.
    after = frame_call(endpoint, {"op": "health", "id": 0})[0]["counters"]
    assert after == before
    # The model it serves is answered, and says which it is.
    header, body = frame_call(endpoint, infer_frame(application=MOBILE, variant="mobilenet"), query())
    assert header["status"] == 200 and header["application"] == MOBILE and header["variant"] == "mobilenet"
    assert response_decode(body)[0]["model_name"] == MOBILE


def test_the_router_never_relays_another_models_answer_and_retries_the_application(runtimes, serve) -> None:
    # classify-resnet's table still routes (most of its traffic) to the slot that now serves classify-mobile.
    tables = [table([route(runtimes["moved"], "sim/gpu0/moved", "resnet50", 10), route(runtimes["resnet"], "sim/gpu0/resnet", "resnet50", 1)],
                    version=7, application=RESNET),
              table([route(runtimes["mobile"], "sim/gpu0/mobile", "mobilenet", 1)], version=3, application=MOBILE)]
    handle, client = serve(TableSource(tables))
    router = handle.router
    for _ in range(30):
        response = client.post(f"/v1/infer/{RESNET}", content=query(), headers={"content-type": "application/json"})
        assert response.status_code == 200, response.text
        assert response.json()["model_name"] == RESNET and response.headers["x-tessera-variant"] == "resnet50"
    # The stale instance is left out for classify-resnet under this table version only, not for classify-mobile.
    assert router.dispatcher.stale == {(RESNET, "sim/gpu0/moved"): 7}
    response = client.post(f"/v1/infer/{MOBILE}", content=query(), headers={"content-type": "application/json"})
    assert response.status_code == 200 and response.json()["model_name"] == MOBILE


def test_only_stale_routes_left_is_a_clear_no_route(runtimes, serve) -> None:
    _, client = serve(TableSource([table([route(runtimes["moved"], "sim/gpu0/moved", "resnet50", 1)], version=2, application=RESNET)]))
    for _ in range(3):
        response = client.post(f"/v1/infer/{RESNET}", content=query(), headers={"content-type": "application/json"})
        assert response.status_code == 503, response.text
        error = response.json()["error"]
        assert error["code"] == "no_route" and "sim/gpu0/moved now serve another model" in error["message"], error


class _UncheckingRuntime:
    """A frame server that answers every query as classify-mobile without looking at what the frame asks for
    (an older runtime): what the router must not relay."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.queries = 0
        started = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self.thread.start()
        started.wait(10)

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", 0))
        self.endpoint = f"tcp://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        started.set()
        self.loop.run_forever()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        parser = FrameParser()
        while data := await reader.read(65536):
            for header, _ in parser.feed(data):
                self.queries += 1
                body, _ = response_encode(None, {"logits": np.zeros((1, 3), np.float32)}, model_name=MOBILE, model_version="mobilenet")
                writer.write(frame_pack({"id": header["id"], "status": 200, "variant": "mobilenet", "simulated": False,
                                         "content_type": "application/json", "header_length": None}, body))

    def stop(self) -> None:
        async def close() -> None:
            self.server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()
            await asyncio.sleep(0.05)  # the cancelled tasks finish
            self.loop.stop()

        asyncio.run_coroutine_threadsafe(close(), self.loop)
        self.thread.join(10)


def test_an_answer_from_a_runtime_that_does_not_check_is_not_relayed(runtimes, serve) -> None:
    unchecking = _UncheckingRuntime()
    try:
        stale = {"instance": "sim/gpu0/old", "variant": "resnet50", "weight": 10, "endpoint": unchecking.endpoint, "state": "ready"}
        _, client = serve(TableSource([table([stale, route(runtimes["resnet"], "sim/gpu0/resnet", "resnet50", 1)], version=5, application=RESNET)]))
        for _ in range(10):
            response = client.post(f"/v1/infer/{RESNET}", content=query(), headers={"content-type": "application/json"})
            assert response.status_code == 200 and response.json()["model_name"] == RESNET, response.text
        assert unchecking.queries >= 1  # it was asked (and answered as classify-mobile): the answer was dropped
    finally:
        unchecking.stop()
