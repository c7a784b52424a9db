"""Files through a real server (docs/files.md): an outside client uploads over HTTP, sends to its own
fake vision model through both HTTP APIs (§14: `file` parts and `input_file`/`input_image` naming the
upload) and inline, and compares what the model received with what was sent; refusals and another
user's file."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from PIL import Image

from tests.e2e.http.support import Gateway, model_server, start_gateway
from tests.support import files as made
from tests.support.fake_openai import FakeOpenAI, Reply, agent_config, describe_image

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAI]:
    with model_server(Reply(echo=True)) as server:
        server.vision_models = {"seeing-model"}
        yield server


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, fake: FakeOpenAI) -> Iterator[Gateway]:
    agents = {
        "eye": agent_config(fake, model="seeing-model", vision=True, max_image_pixels=200 * 150),
        "blind": agent_config(fake),
    }
    tmp = tmp_path_factory.mktemp("files")
    gateway = start_gateway(
        tmp,
        GATEWAY_AGENTS=json.dumps(agents),
        GATEWAY_FILES_STORAGE_OPTIONS=json.dumps({"location": str(tmp / "stored")}),
    )
    yield gateway
    gateway.stop()


def upload(gw: Gateway, data: bytes, name: str, who: str = "alice") -> dict[str, Any]:
    with gw.http(who) as http:
        answer = http.post("/api/files", files={"file": (name, data)})
    assert answer.status_code == 201, answer.text
    body: dict[str, Any] = answer.json()
    return body


def sent(answer_text: str) -> list[dict[str, Any]]:
    return list(json.loads(answer_text)["messages"])


def refused(call: Any) -> dict[str, Any]:
    with pytest.raises(openai.BadRequestError) as bad:
        call()
    assert isinstance(bad.value.body, dict)
    return dict(bad.value.body)


def test_an_upload_reaches_the_vision_model_through_both_apis(gw: Gateway) -> None:
    photo = made.jpeg_with_exif(800, 600)
    report = made.pdf("Revenue rose four percent", "Costs fell")
    image_id = upload(gw, photo, "cam.jpg")["id"]
    pdf = upload(gw, report, "report.pdf")
    assert pdf["mimeType"] == "application/pdf" and pdf["size"] == len(report)
    client = gw.sdk()

    parts = [
        {"type": "text", "text": "describe both"},
        {"type": "file", "file": {"file_id": image_id}},
        {"type": "file", "file": {"file_id": pdf["id"]}},
    ]
    answer = client.chat.completions.create(model="eye", messages=[{"role": "user", "content": parts}])
    [message] = sent(answer.choices[0].message.content or "")
    text, image = message["content"]
    assert text["type"] == "text" and text["text"].startswith("describe both\n\n")
    assert "Revenue rose four percent" in text["text"] and "Costs fell" in text["text"]
    assert '<file name="report.pdf" type="application/pdf" trust="untrusted">' in text["text"]
    seen = describe_image(image["image_url"]["url"])
    assert seen["width"] * seen["height"] <= 200 * 150 and seen["height"] > seen["width"] and not seen["exif"]

    items = [
        {"type": "input_text", "text": "and this?"},
        {"type": "input_image", "file_id": image_id},
        {"type": "input_file", "file_id": pdf["id"]},
    ]
    response = client.responses.create(model="eye", input=[{"role": "user", "content": items}])
    [message] = sent(response.output_text)
    assert [p["type"] for p in message["content"]] == ["text", "image_url"]
    assert "Revenue rose four percent" in message["content"][0]["text"]


def test_an_inline_image_is_downscaled_for_the_model(gw: Gateway) -> None:
    big = io.BytesIO()
    Image.new("RGB", (1000, 1000), (1, 2, 3)).save(big, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(big.getvalue()).decode()
    answer = gw.sdk().responses.create(
        model="eye", input=[{"role": "user", "content": [{"type": "input_image", "image_url": url}]}]
    )
    [message] = sent(answer.output_text)
    seen = describe_image(message["content"][0]["image_url"]["url"])
    assert seen["width"] * seen["height"] <= 200 * 150 and seen["width"] == seen["height"]


def test_refusals_name_the_part(gw: Gateway) -> None:
    client = gw.sdk()
    bobs = upload(gw, made.png(), "bob.png", who="bob")["id"]
    mine = upload(gw, made.png(), "mine.png")["id"]
    theirs = [{"role": "user", "content": [{"type": "file", "file": {"file_id": bobs}}]}]
    error = refused(lambda: client.chat.completions.create(model="eye", messages=theirs))
    assert error["param"] == "messages[0].content[0].file.file_id" and error["code"] == "file_not_found"
    assert "not found among your files" in error["message"]
    blind = [{"role": "user", "content": [{"type": "input_image", "file_id": mine}]}]
    error = refused(lambda: client.responses.create(model="blind", input=blind))
    assert error["param"] == "input[0].content[0]" and error["code"] == "unsupported_content"
    assert "vision: true" in error["message"]
    earlier = [
        {"role": "user", "content": [{"type": "file", "file": {"file_id": mine}}]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "and?"},
    ]
    error = refused(lambda: client.chat.completions.create(model="eye", messages=earlier))
    assert error["param"] == "messages[0].content[0].file" and "new message only" in error["message"]
