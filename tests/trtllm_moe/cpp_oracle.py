"""A literal, loop-by-loop rendering of TensorRT-LLM's cutlass_preprocessors.cpp in
Python over NumPy buffers: word-level row permutation, the 64×64 tiled sub-byte
transpose with its cache buffer, word-level column interleave, per-byte bias and
per-register nibble shuffle. Slow, written independently of the vectorised torch code
under test, and used only on tiny shapes as the bit-exact oracle."""

from __future__ import annotations

import numpy as np

PERMS = {
    8: [0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15],
    4: [0, 1, 8, 9, 16, 17, 24, 25, 2, 3, 10, 11, 18, 19, 26, 27, 4, 5, 12, 13, 20, 21, 28, 29, 6, 7, 14, 15,
        22, 23, 30, 31],
    "fp8": [0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23, 8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14,
            15, 28, 29, 30, 31],
}


def permute_B_rows(buf: np.ndarray, shape, bits: int, perm: list[int]) -> np.ndarray:
    num_experts, num_rows, num_cols = shape
    inp = buf.view(np.uint32)
    out = np.zeros_like(inp)
    k = 16 // bits
    b_rows_per_mma = 8 * k
    num_vec_cols = num_cols // (32 // bits)
    for expert in range(num_experts):
        matrix_offset = expert * num_rows * num_vec_cols
        for base_row in range(0, num_rows, b_rows_per_mma):
            for tile_row in range(b_rows_per_mma):
                for write_col in range(num_vec_cols):
                    write_row = base_row + tile_row
                    read_row = base_row + perm[tile_row]
                    out[matrix_offset + write_row * num_vec_cols + write_col] = inp[
                        matrix_offset + read_row * num_vec_cols + write_col
                    ]
    return out.view(np.uint8)


def subbyte_transpose(buf: np.ndarray, shape, bits: int) -> np.ndarray:
    num_experts, num_rows, num_cols = shape
    col_bytes = num_cols * bits // 8
    col_bytes_trans = num_rows * bits // 8
    out = np.zeros_like(buf)
    elts_per_byte = 8 // bits
    m_tile = 64
    n_tile = m_tile // elts_per_byte
    for expert in range(num_experts):
        matrix_offset = expert * num_rows * col_bytes
        for row_tile_start in range(0, num_rows, m_tile):
            for col_tile_start_byte in range(0, col_bytes, n_tile):
                cache = np.zeros((m_tile, n_tile), dtype=np.uint8)
                row_limit = min(row_tile_start + m_tile, num_rows)
                col_limit = min(col_tile_start_byte + n_tile, col_bytes)
                for ii in range(m_tile):
                    row = row_tile_start + ii
                    for jj in range(n_tile):
                        col = col_tile_start_byte + jj
                        if row < row_limit and col < col_limit:
                            cache[ii, jj] = buf[matrix_offset + row * col_bytes + col]
                if bits == 8:
                    for ii in range(m_tile):
                        for jj in range(ii + 1, n_tile):
                            cache[ii, jj], cache[jj, ii] = cache[jj, ii], cache[ii, jj]
                else:
                    for ii in range(m_tile):
                        for jj in range(ii + 1, m_tile):
                            ii_byte, ii_bit = ii // 2, ii % 2
                            jj_byte, jj_bit = jj // 2, jj % 2
                            src = 0xF & (int(cache[ii, jj_byte]) >> (4 * jj_bit))
                            tgt = 0xF & (int(cache[jj, ii_byte]) >> (4 * ii_bit))
                            cache[ii, jj_byte] &= 0xF0 >> (4 * jj_bit)
                            cache[jj, ii_byte] &= 0xF0 >> (4 * ii_bit)
                            cache[ii, jj_byte] |= (tgt << (4 * jj_bit)) & 0xFF
                            cache[jj, ii_byte] |= (src << (4 * ii_bit)) & 0xFF
                row_tile_start_trans = col_tile_start_byte * elts_per_byte
                col_tile_start_byte_trans = row_tile_start // elts_per_byte
                row_limit_t = min(row_tile_start_trans + m_tile, num_cols)
                col_limit_t = min(col_tile_start_byte_trans + n_tile, col_bytes_trans)
                for ii in range(m_tile):
                    row = row_tile_start_trans + ii
                    for jj in range(n_tile):
                        col = col_tile_start_byte_trans + jj
                        if row < row_limit_t and col < col_limit_t:
                            out[matrix_offset + row * col_bytes_trans + col] = cache[ii, jj]
    return out


def interleave_column_major(buf: np.ndarray, shape, bits: int, rows_per_tile: int, interleave: int) -> np.ndarray:
    num_experts, num_rows, num_cols = shape
    inp = buf.view(np.uint32)
    out = np.zeros_like(inp)
    elts_in_int32 = 32 // bits
    num_vec_rows = num_rows // elts_in_int32
    vec_rows_per_tile = rows_per_tile // elts_in_int32
    for expert in range(num_experts):
        matrix_offset = expert * num_vec_rows * num_cols
        for read_col in range(num_cols):
            write_col = read_col // interleave
            for base_vec_row in range(0, num_vec_rows, vec_rows_per_tile):
                for vec_read_row in range(base_vec_row, min(num_vec_rows, base_vec_row + vec_rows_per_tile)):
                    vec_write_row = (interleave * base_vec_row + vec_rows_per_tile * (read_col % interleave)
                                     + vec_read_row % vec_rows_per_tile)
                    out[matrix_offset + write_col * num_vec_rows * interleave + vec_write_row] = inp[
                        matrix_offset + read_col * num_vec_rows + vec_read_row
                    ]
    return out.view(np.uint8)


def add_bias_and_interleave(buf: np.ndarray, num_elts: int, bits: int) -> np.ndarray:
    out = buf.copy()
    if bits == 8:
        for ii in range(num_elts):
            out[ii] = (int(out[ii]) + 128) & 0xFF
        for base in range(0, num_elts, 4):
            out[base + 1], out[base + 2] = out[base + 2], out[base + 1]
        return out
    s = out.view(np.int8)
    for ii in range(num_elts // 2):
        v = int(s[ii])
        first = ((v << 4) & 0xFF)
        first = (first - 256 if first >= 128 else first) >> 4
        second = v >> 4
        first, second = first + 8, second + 8
        assert 0 <= first <= 15 and 0 <= second <= 15
        out[ii] = first | (second << 4)
    regs = out.view(np.uint32)
    for ii in range(regs.size):
        cur = int(regs[ii])
        t = 0
        for dest in range(8):
            src = 2 * dest if dest < 4 else 2 * (dest - 4) + 1
            t |= ((cur >> (4 * src)) & 0xF) << (4 * dest)
        regs[ii] = t
    return out


def preprocess(weight: np.ndarray, bits: int, arch: int, force_interleave: bool, fp8_act: bool = False) -> np.ndarray:
    """``weight``: int8 array [E, K, N·bits/8]; returns the int8 output."""
    if force_interleave and arch == 90:
        arch = 80
    num_experts, num_rows, nb = weight.shape
    num_cols = nb * 8 // bits
    shape = (num_experts, num_rows, num_cols)
    tb_k = 128 if fp8_act else 64
    if 75 <= arch < 90:
        ldsm, col_major, rows_per_tile, interleave = True, True, tb_k, (1024 // bits) // tb_k
    elif arch == 90 or 70 <= arch < 75:
        ldsm, col_major, rows_per_tile, interleave = False, True, 1, 1
    else:
        raise ValueError(arch)
    buf = weight.reshape(-1).view(np.uint8).copy()
    if ldsm:
        buf = permute_B_rows(buf, shape, bits, PERMS["fp8" if fp8_act else bits])
    if col_major:
        buf = subbyte_transpose(buf, shape, bits)
    if interleave > 1:
        buf = interleave_column_major(buf, shape, bits, rows_per_tile, interleave)
    if 70 <= arch < 90:
        buf = add_bias_and_interleave(buf, num_experts * num_rows * num_cols, bits)
    return buf.view(np.int8).reshape(weight.shape)
