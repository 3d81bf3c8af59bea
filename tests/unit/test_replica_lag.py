from __future__ import annotations

from service.db.replica import parse_lsn


def test_wal_positions_compare_as_bytes() -> None:
    assert parse_lsn("0/0") == 0
    assert parse_lsn("0/3000148") == 0x3000148
    assert parse_lsn("1/0") - parse_lsn("0/FFFFFFFF") == 1
    assert parse_lsn("16/B374D848") > parse_lsn("16/B374D847")
