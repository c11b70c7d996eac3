"""``durq worker --processes auto`` counts the CPUs a container may use, not the host's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from durq.worker.supervisor import available_cpus, cgroup_cpu_quota, resolve_processes

NO_GROUP = Path("/nonexistent/cgroup")


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize(
    ("cpu_max", "quota"),
    [("200000 100000\n", 2.0), ("150000 100000\n", 1.5), ("max 100000\n", None)],
)
def test_cgroup_v2_quota(tmp_path: Path, cpu_max: str, quota: float | None) -> None:
    write(tmp_path / "cpu.max", cpu_max)
    assert cgroup_cpu_quota(tmp_path, NO_GROUP) == quota


def test_cgroup_v2_quota_of_the_process_own_group(tmp_path: Path) -> None:
    write(tmp_path / "kubepods" / "pod1" / "cpu.max", "100000 100000\n")
    write(tmp_path / "self_cgroup", "0::/kubepods/pod1\n")
    assert cgroup_cpu_quota(tmp_path, tmp_path / "self_cgroup") == 1.0


def test_cgroup_v1_quota(tmp_path: Path) -> None:
    write(tmp_path / "cpu" / "cpu.cfs_quota_us", "300000\n")
    write(tmp_path / "cpu" / "cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_quota(tmp_path, NO_GROUP) == 3.0
    write(tmp_path / "cpu" / "cpu.cfs_quota_us", "-1\n")  # unlimited
    assert cgroup_cpu_quota(tmp_path, NO_GROUP) is None


def test_no_cgroup_files_means_no_quota(tmp_path: Path) -> None:
    assert cgroup_cpu_quota(tmp_path, NO_GROUP) is None


def test_a_quota_caps_the_cpu_count_rounded_up(tmp_path: Path) -> None:
    cpus = len(os.sched_getaffinity(0))
    write(tmp_path / "cpu.max", "50000 100000\n")  # half a CPU still gets one process
    assert available_cpus(tmp_path) == 1
    write(tmp_path / "cpu.max", f"{(cpus + 5) * 100000} 100000\n")  # above the host's count
    assert available_cpus(tmp_path) == cpus
    write(tmp_path / "cpu.max", "max 100000\n")
    assert available_cpus(tmp_path) == cpus


def test_auto_uses_the_available_cpus() -> None:
    assert resolve_processes("auto") == available_cpus()
