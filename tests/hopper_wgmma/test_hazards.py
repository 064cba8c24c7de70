"""The SASS checker for registers an in-flight HGMMA reads (tools/probes/
hopper_wgmma_hazards.py), on listings written by hand in ``cuobjdump -sass`` form: it
flags a write before the retiring ``WARPGROUP.DEPBAR``, counts groups as the hardware
does, follows branches and loops, and stays quiet where the code is safe."""

from __future__ import annotations

from tools.probes.hopper_wgmma_hazards import operand_hazards, parse_sass


def _sass(*lines: str) -> str:
    """A listing: one instruction a line, at consecutive addresses (16 bytes apart)."""
    return "\n".join(f"        /*{16 * i:04x}*/                   {line} ;  /* 0x0 */" for i, line in enumerate(lines))


def _at(i: int) -> str:
    return f"0x{16 * i:x}"


GROUP_A = ["WARPGROUP.ARRIVE", "HGMMA.64x16x16.F32.BF16 R24, R152, gdesc[UR4], R24",
           "HGMMA.64x16x16.F32.BF16 R24, R156, gdesc[UR4], R24, gsb0"]


def test_parse_reads_address_predicate_opcode_and_operands() -> None:
    code = parse_sass(_sass("@!P0 BRA 0x40", "LDS.128 R152, [R3+0x10]"))
    assert [(c.addr, c.predicated, c.op) for c in code] == [(0, True, "BRA"), (16, False, "LDS.128")]
    assert code[1].operands == ("R152", "[R3+0x10]")


def test_a_write_to_an_operand_before_its_wait_is_flagged() -> None:
    found = operand_hazards(_sass(*GROUP_A, "LOP3.LUT R154, R9, 0xf000f, R21, 0xea, !PT",
                                  "WARPGROUP.DEPBAR.LE gsb0, 0x0"))
    assert [(h.hgmma_addr, h.register, h.role) for h in found] == [(16, 154, "A")]


def test_writes_after_the_retiring_wait_are_fine() -> None:
    assert operand_hazards(_sass(*GROUP_A, "WARPGROUP.DEPBAR.LE gsb0, 0x0",
                                 "LOP3.LUT R154, R9, 0xf000f, R21, 0xea, !PT", "EXIT")) == []


def test_a_wait_that_leaves_the_group_in_flight_does_not_retire_it() -> None:
    # One group committed, DEPBAR.LE 1 may leave it running: the LDS.128 overwrites R156..R159.
    found = operand_hazards(_sass(*GROUP_A, "WARPGROUP.DEPBAR.LE gsb0, 0x1", "LDS.128 R156, [R3]",
                                  "WARPGROUP.DEPBAR.LE gsb0, 0x0"))
    assert {h.register for h in found} == {156, 157, 158, 159}
    # With a later group committed, the same wait retires the first one.
    later = ["WARPGROUP.ARRIVE", "HGMMA.64x16x16.F32.BF16 R24, R200, gdesc[UR4], R24, gsb0"]
    assert operand_hazards(_sass(*GROUP_A, *later, "WARPGROUP.DEPBAR.LE gsb0, 0x1", "LDS.128 R156, [R3]",
                                 "WARPGROUP.DEPBAR.LE gsb0, 0x0")) == []


def test_the_accumulator_may_be_chained_but_not_written() -> None:
    assert operand_hazards(_sass(*GROUP_A, *GROUP_A[1:], "WARPGROUP.DEPBAR.LE gsb0, 0x0")) == []
    found = operand_hazards(_sass(*GROUP_A, "FADD R30, R30, 1", "WARPGROUP.DEPBAR.LE gsb0, 0x0"))
    assert {(h.register, h.role) for h in found} == {(30, "acc")}  # from both HGMMAs of the chain


def test_a_write_in_the_next_trip_of_a_loop_is_flagged() -> None:
    """One block per trip with its group left in flight: the next trip rewrites its operand
    before the wait that retires it — the failure the in-flight plans avoid."""
    loop = _sass("LDS.128 R152, [R3]",  # loop head: the next block's operand
                 *GROUP_A,
                 "WARPGROUP.DEPBAR.LE gsb0, 0x1",
                 f"@P0 BRA {_at(0)}",
                 "WARPGROUP.DEPBAR.LE gsb0, 0x0", "EXIT")
    found = operand_hazards(loop)
    assert {h.register for h in found} == {152, 153, 154, 155} and {h.writer_addr for h in found} == {0}


def test_two_blocks_per_trip_in_different_registers_are_clean() -> None:
    block_b = ["WARPGROUP.ARRIVE", "HGMMA.64x16x16.F32.BF16 R24, R200, gdesc[UR4], R24",
               "HGMMA.64x16x16.F32.BF16 R24, R204, gdesc[UR4], R24, gsb0"]
    loop = _sass("LDS.128 R152, [R3]", "LDS.128 R156, [R3+0x10]", *GROUP_A, "WARPGROUP.DEPBAR.LE gsb0, 0x1",
                 "LDS.128 R200, [R3+0x20]", "LDS.128 R204, [R3+0x30]", *block_b, "WARPGROUP.DEPBAR.LE gsb0, 0x1",
                 f"@P0 BRA {_at(0)}", "WARPGROUP.DEPBAR.LE gsb0, 0x0", "EXIT")
    assert operand_hazards(loop) == []


def test_both_sides_of_a_branch_are_followed() -> None:
    # The write is reached only when the branch is taken.
    sass = _sass(*GROUP_A, f"@P1 BRA {_at(5)}", f"BRA {_at(6)}",
                 "HFMA2.BF16_V2 R157, R1, R2, -136, -136", "WARPGROUP.DEPBAR.LE gsb0, 0x0", "EXIT")
    assert [h.register for h in operand_hazards(sass)] == [157]
    # Not reachable before the wait: clean.
    sass = _sass(*GROUP_A, f"BRA {_at(5)}", "HFMA2.BF16_V2 R157, R1, R2, -136, -136",
                 "WARPGROUP.DEPBAR.LE gsb0, 0x0", "EXIT")
    assert operand_hazards(sass) == []


def test_register_counts_of_wide_writes() -> None:
    # LDSM without a count writes one register, .4 four; IMAD.WIDE two.
    quiet = ["LDSM.16.MT88 R151, [R19]", "IMAD.WIDE R150, R1, R2, R3", "LDSM.16.M88.4 R148, [R19]"]
    assert operand_hazards(_sass(*GROUP_A, *quiet, "WARPGROUP.DEPBAR.LE gsb0, 0x0")) == []
    loud = ["LDSM.16.M88.4 R150, [R19]"]
    assert {h.register for h in operand_hazards(_sass(*GROUP_A, *loud, "WARPGROUP.DEPBAR.LE gsb0, 0x0"))} == {152, 153}


def test_stores_and_predicate_writes_write_no_register() -> None:
    assert operand_hazards(_sass(*GROUP_A, "STS.128 [R152], R4", "ISETP.NE.AND P0, PT, R154, RZ, PT",
                                 "WARPGROUP.DEPBAR.LE gsb0, 0x0")) == []
