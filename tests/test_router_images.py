"""The router counts a chat request's images without decoding them, and refuses what it will
not pass on (remote URLs, malformed data URLs) naming the part; the price rule adds delta MU per
image."""

import base64

import pytest

from capacity.units import CostModel
from dataplane.router.images import MAX_IMAGE_BYTES, ImageCount, ImageError, count_images, data_url_bytes
from dataplane.wire.routing_table import RoutedEndpoint


def data_url(raw: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(raw).decode()}"


def chat(*parts):
    return [{"role": "system", "content": "be brief"}, {"role": "user", "content": list(parts)}]


@pytest.mark.parametrize("size", [1, 2, 3, 4, 3000, 4097])
def test_sizes_come_from_the_base64_length_alone(size):
    assert data_url_bytes(data_url(b"\x89" * size), "p") == size


def test_image_parts_are_counted_and_other_parts_are_not():
    text = {"type": "text", "text": "what is in these?"}
    one, two = data_url(b"a" * 3000), data_url(b"b" * 10, "image/jpeg")
    parts = (
        text,
        {"type": "image_url", "image_url": {"url": one}},
        {"type": "image_url", "image_url": {"url": two}},
    )
    assert count_images(chat(*parts)) == ImageCount(2, 3010)
    assert count_images([{"role": "user", "content": "no images"}]) == ImageCount(0, 0)
    assert count_images("not a list") == ImageCount(0, 0)


@pytest.mark.parametrize(
    "url, says",
    [
        ("https://example.com/cat.png", "not 'https'"),
        ("file:///etc/passwd", "not 'file'"),
        ("data:text/plain;base64,aGk=", "data:<image/png"),
        ("data:image/png,rawbytes", "data:<image/png"),
        ("data:image/png;base64,abc", "multiple of 4"),
        ("data:image/png;base64,", "multiple of 4"),
    ],
)
def test_a_part_it_will_not_pass_on_is_refused_naming_it(url, says):
    with pytest.raises(ImageError, match=says) as refused:
        count_images(chat({"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": url}}))
    assert refused.value.param == "messages[1].content[1].image_url.url"


def test_a_missing_url_and_an_oversized_image_are_refused():
    with pytest.raises(ImageError) as refused:
        count_images(chat({"type": "image_url", "image_url": {}}))
    assert refused.value.param == "messages[1].content[0].image_url.url"
    huge = "data:image/png;base64," + "A" * ((MAX_IMAGE_BYTES // 3 + 1) * 4)
    with pytest.raises(ImageError, match="at most"):
        data_url_bytes(huge, "p")


def test_images_cost_delta_each_and_the_routing_table_carries_delta():
    model = CostModel(0.0004, 0.004, 0.02, delta=0.05)
    assert model.cost(50, 50, images=2) == pytest.approx(0.24 + 0.1)
    assert model.cost(50, 50) == pytest.approx(0.24)
    endpoint = RoutedEndpoint(1, "acme", "chat", "m", "p2c", model, 100.0, 0, False, None, ())
    assert RoutedEndpoint.from_json(endpoint.to_json()).coefficients == model
