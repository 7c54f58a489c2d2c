"""The test cluster's port choice (tests/ray_cluster.py): no node's ports may fall in another's
workers' range, nor in the range of the ports its own command line names (``ray start`` refuses
to start: seen once when the head's GCS port landed in its workers' range)."""
from __future__ import annotations

from tests import ray_cluster


def test_the_workers_range_avoids_the_ports_named_and_taken(monkeypatch):
    offers = iter([5000, 5001, 5002, 5003, 5004, 5005,  # the node's own ports
                   4990,                                # a range 4990-5030 holding them: refused
                   7000, 9000])                         # 7000-7040 holds 7010, which is taken
    monkeypatch.setattr(ray_cluster, "free_port", lambda: next(offers))
    args, ports = ray_cluster._ports([7010])
    assert args[-4:] == ["--min-worker-port", "9000", "--max-worker-port", "9040"]
    assert ports == [5000, 5001, 5002, 5003, 5004, 5005, *range(9000, 9041)]


def test_a_node_never_gets_a_port_already_taken(monkeypatch):
    offers = iter([6379, 5000, 5001, 5002, 5003, 5004, 5005, 9000])
    monkeypatch.setattr(ray_cluster, "free_port", lambda: next(offers))
    args, ports = ray_cluster._ports([6379])
    assert 6379 not in ports and args[:2] == ["--node-manager-port", "5000"]


def test_the_ports_a_command_line_names():
    assert ray_cluster._named_ports(["--head", "--port", "6379", "--num-cpus", "1",
                                     "--dashboard-port", "8265", "--address", "10.0.0.2:6380"]) == [
        6379, 8265, 6380]
