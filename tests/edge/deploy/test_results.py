"""edge.deploy.fetched_devices: a folder of fetched device results read back as data (no report written)."""

import json

from edge.deploy import FetchedDevice, fetched_devices


def test_every_device_folder_with_a_record_is_read_back(tmp_path):
    done = tmp_path / "user@a_22"
    (done / "results").mkdir(parents=True)
    (done / "deploy.json").write_text(json.dumps({"label": "user@a_22", "status": "ok"}))
    run = {"variants": {"m.fp32": {"status": "done", "result": "m.fp32.json"},
                        "m.fp16": {"status": "failed", "result": "m.fp16.json"},   # never written
                        "m.int8": {"status": "skipped"}}}                          # no result named
    (done / "results" / "run.json").write_text(json.dumps(run))
    (done / "results" / "m.fp32.json").write_text(json.dumps({"latency": {"median_ms": 2.0}}))
    failed = tmp_path / "user@b_22"
    failed.mkdir()
    (failed / "deploy.json").write_text(json.dumps({"label": "user@b_22", "status": "failed"}))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "deploy.json").write_text("{half")  # an unreadable record is left out
    (tmp_path / "stray").mkdir()                                  # so is a folder without one
    assert fetched_devices(tmp_path) == [
        FetchedDevice(done, {"label": "user@a_22", "status": "ok"}, run,
                      {"m.fp32": {"latency": {"median_ms": 2.0}}, "m.fp16": None}),
        FetchedDevice(failed, {"label": "user@b_22", "status": "failed"}, None, {})]
    assert fetched_devices(tmp_path / "missing") == []
