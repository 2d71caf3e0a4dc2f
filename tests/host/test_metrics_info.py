"""The info gauges of the host's metrics: the CPU the engine runs on and the runner's settings in force."""

from __future__ import annotations

from llmkiln.host.metrics import HostMetrics, exposition


def test_cpu_features_and_settings_are_exposed_once_each():
    m = HostMetrics()
    m.settings = {
        "cpu_model": 'Intel(R) Xeon(R) "Processor"',
        "cpu_kind": "amx",
        "cpu_amx": "1",
        "precision": "bf16",
        "INFERENCE_NUM_THREADS": "1",
    }
    text = exposition(m, {"worker": "0"})
    lines = text.splitlines()
    cpu = [ln for ln in lines if ln.startswith("llmkiln_cpu_features{")]
    assert cpu == [
        'llmkiln_cpu_features{worker="0",cpu_model="Intel(R) Xeon(R) \\"Processor\\"",kind="amx",amx="1"} 1'
    ]
    settings = [ln for ln in lines if ln.startswith("llmkiln_runtime_setting{")]
    assert settings == [
        'llmkiln_runtime_setting{worker="0",name="precision",value="bf16"} 1',
        'llmkiln_runtime_setting{worker="0",name="INFERENCE_NUM_THREADS",value="1"} 1',
    ]
    assert lines.count("# TYPE llmkiln_cpu_features gauge") == 1
    assert lines.count("# TYPE llmkiln_runtime_setting gauge") == 1


def test_no_settings_no_info_lines():
    assert "llmkiln_cpu_features" not in exposition(HostMetrics())
