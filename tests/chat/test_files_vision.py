"""Images and documents reach the `openai` backend's model (the fake, as a vision model that checks the
parts it receives), through the real WebSocket gateway and the real upload door."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from chat.runtime.backends.attached import UNTRUSTED_NOTE
from tests.support import files as made
from tests.support.communicator import Client
from tests.support.db import send_params
from tests.support.fake_openai import Reply

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "agent:llm:chat"


async def send(client: Client, run_id: str, message: str, attachments: list[dict[str, Any]]) -> dict[str, Any]:
    return await client.call("chat.send", send_params(KEY, message, run_id, attachments=attachments))


async def test_an_uploaded_photo_reaches_a_vision_model_downscaled_upright_and_without_exif(
    alice, client, fake, use_agent
):
    use_agent(vision=True, max_image_pixels=120 * 90)
    fake.vision_models = {"fake-model"}
    photo = made.jpeg_with_exif(640, 480)
    file_id = (await made.upload(alice[1], photo, "cam.jpg")).json()["id"]

    res = await send(client, "v1", "what is this?", [{"fileId": file_id}])
    assert res["ok"] and res["payload"]["status"] == "started", res
    assert (await client.wait_terminal("v1"))["state"] == "final"
    request = fake.requests[0]
    assert request.messages[-1]["content"][0] == {"type": "text", "text": "what is this?"}
    [image] = request.images()
    assert image["message"] == len(request.messages) - 1 and image["mime"] == "image/jpeg"
    assert image["width"] * image["height"] <= 120 * 90
    assert image["height"] > image["width"]  # turned as its EXIF said, then the EXIF dropped
    assert image["exif"] is False

    fake.push(Reply(chunks=["Still a photo."]))
    await send(client, "v2", "and now?", [])
    await client.wait_terminal("v2")
    later = fake.requests[1]
    assert later.messages[-1] == {"role": "user", "content": "and now?"}
    assert [i["message"] for i in later.images()] == [0]  # the first turn carries its image again
    assert later.messages[0]["content"][0]["text"] == "what is this?"


async def test_an_inline_image_with_transparency_is_sent_as_png(client, fake, use_agent):
    use_agent(vision=True)
    fake.vision_models = {"fake-model"}
    data = made.png(30, 20, color=(0, 0, 0, 0), mode="RGBA")
    inline = {"mimeType": "image/png", "fileName": "t.png", "content": base64.b64encode(data).decode()}
    res = await send(client, "p1", "", [inline])
    assert res["ok"], res
    await client.wait_terminal("p1")
    [image] = fake.requests[0].images()
    assert (image["mime"], image["width"], image["height"]) == ("image/png", 30, 20)
    assert fake.requests[0].messages[-1]["content"] == [fake.requests[0].image_parts()[0][1]]  # no empty text part


async def test_earlier_images_become_a_placeholder_when_the_agent_says_so(alice, client, fake, use_agent):
    use_agent(vision=True, history_images=False)
    fake.vision_models = {"fake-model"}
    file_id = (await made.upload(alice[1], made.png(), "chart.png")).json()["id"]
    await send(client, "h1", "see", [{"fileId": file_id}])
    await client.wait_terminal("h1")
    await send(client, "h2", "again", [])
    await client.wait_terminal("h2")
    later = fake.requests[1]
    assert later.images() == []
    assert later.messages[0] == {"role": "user", "content": "see\n\n[image chart.png: not sent again]"}


async def test_an_image_to_a_model_without_vision_is_refused_in_its_ack(alice, client, fake, use_agent):
    use_agent()  # no `vision: true`
    file_id = (await made.upload(alice[1], made.png(), "chart.png")).json()["id"]
    res = await send(client, "n1", "what is this?", [{"fileId": file_id}])
    assert not res["ok"] and res["payload"]["status"] == "error"
    assert "cannot take images" in res["error"]["message"] and "vision: true" in res["error"]["message"]
    assert fake.requests == []  # nothing sent, nothing silently dropped


async def test_documents_reach_the_model_as_untrusted_text_within_the_agents_budget(alice, client, fake, use_agent):
    use_agent(document_chars=60)
    pdf_id = (await made.upload(alice[1], made.pdf("The tide is at noon"), "tide.pdf")).json()["id"]
    scan_id = (await made.upload(alice[1], made.pdf(""), "scan.pdf")).json()["id"]
    csv_id = (await made.upload(alice[1], b"name,qty\n" + b"apples,3\n" * 50, "stock.csv")).json()["id"]
    res = await send(client, "d1", "summarise", [{"fileId": pdf_id}, {"fileId": scan_id}, {"fileId": csv_id}])
    assert res["ok"], res
    await client.wait_terminal("d1")
    text = fake.requests[0].messages[-1]["content"]
    assert isinstance(text, str) and text.startswith("summarise\n\n")
    assert '<file name="tide.pdf" type="application/pdf" trust="untrusted">' in text and UNTRUSTED_NOTE in text
    assert "The tide is at noon" in text
    assert '<file name="scan.pdf"' in text and "no text layer" in text
    assert '<file name="stock.csv" type="text/csv"' in text and "[truncated: the first 0 of" in text
