"""ResNet-, ViT-, ConvNeXt-, Swin- and EfficientNet-style models through minicompile.compile:
1 graph each, outputs equal to eager."""
import pytest
import torch

from minicompile import explain   # the whole pipeline: capture, then aot/decomp/lowering/codegen
from tests.capture.image_models import MODELS


@pytest.mark.parametrize("name", sorted(MODELS))
def test_image_model_one_graph(name):
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        expected = model(x)
        report = explain(model)(x)
    assert torch.allclose(report.output, expected, atol=1e-5), (report.output - expected).abs().max()
    assert report.graph_count == 1 and report.break_count == 0 and not report.fallbacks, report
