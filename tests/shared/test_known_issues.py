"""known_issues: each known-bad combination as a pure function of facts."""

from __future__ import annotations

from fastpath.shared.known_issues import dao_sm103_nvcc13, fla_640, host_gcc_unsupported


def test_fla_640_reads_versions_like_fla():
    assert fla_640((9, 0), "3.7.1rc1", False) and not fla_640((9, 0), "3.7.1", False)
    assert not fla_640((9, 0), "3.6.0", True) and not fla_640((10, 0), "3.6.0", False)
    assert not fla_640(None, "3.6.0", False) and not fla_640((9, 0), "not-a-version", False)


def test_dao_sm103_nvcc13():
    assert dao_sm103_nvcc13((10, 3), ["sm_100", "sm_103"], True, []) == "installed build has sm_103 SASS"
    assert dao_sm103_nvcc13((10, 3), [], False, [13]) == "a source build with this host's nvcc 13"
    assert dao_sm103_nvcc13((10, 3), [], False, [12]) is None
    assert dao_sm103_nvcc13((10, 3), ["sm_100"], True, [13]) is None  # installed, no sm_103 code
    assert dao_sm103_nvcc13((10, 0), ["sm_103"], True, [13]) is None


def test_host_gcc_unsupported():
    assert host_gcc_unsupported("12.8", "14.2.0") == (6, 13)
    assert host_gcc_unsupported("12.8", "13.3.0") is None
    assert host_gcc_unsupported("13.0", "14.2.0") is None  # no source for 13.0's bounds
    assert host_gcc_unsupported("12.8", "weird") is None and host_gcc_unsupported("12.8", None) is None
