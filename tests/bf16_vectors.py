#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# Prints the float -> bf16 reference vectors of tests/test_bf16.cpp, computed
# independently of the code under test: each float's exact value (a Fraction)
# against every finite bf16 value, nearest wins, a tie goes to the even
# pattern, and from halfway past the largest bf16 on a value becomes Inf.
import math
import struct

from fractions import Fraction as F

def f32(bits): return struct.unpack('<f', struct.pack('<I', bits))[0]
def bf_val(b):  # exact value of a finite bf16 pattern
    return F(f32(b << 16))
# All finite non-negative bf16 patterns 0x0000..0x7f7f, values increasing with the pattern.
pos = [(b, bf_val(b)) for b in range(0x0000, 0x7f80)]
MAXV = pos[-1][1]; ULP_TOP = F(2)**(127-7)
def ref(bits):
    x = f32(bits); sign = bits >> 31
    if math.isnan(x): return None
    if math.isinf(x): return (sign << 15) | 0x7f80
    v = abs(F(x))
    if v >= MAXV + ULP_TOP / 2:  # halfway to 2^128 or beyond: IEEE rounds to Inf (tie goes to even = Inf)
        return (sign << 15) | 0x7f80
    # binary search nearest
    lo, hi = 0, len(pos) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if pos[mid][1] <= v: lo = mid
        else: hi = mid
    a, b = pos[lo], pos[hi]
    if v == a[1]: r = a[0]
    elif v == b[1]: r = b[0]
    else:
        da, db = v - a[1], b[1] - v
        r = a[0] if da < db else b[0] if db < da else (a[0] if a[0] % 2 == 0 else b[0])
    return (sign << 15) | r
cases = [
 (0x00000000,'+0'),(0x80000000,'-0'),(0x3f800000,'1'),(0xbf800000,'-1'),
 (0x7f800000,'+Inf'),(0xff800000,'-Inf'),
 (0x3f808000,'1 + half ulp: tie, even is down'),(0x3f818000,'1+1.5ulp: tie, even is up'),
 (0x3f808001,'just above tie: up'),(0x3f807fff,'just below tie: down'),
 (0xbf808000,'-tie down'),(0xbf818000,'-tie up'),
 (0x7f7f0000,'max bf16 exactly'),(0x7f7f7fff,'just below halfway to 2^128: max'),
 (0x7f7f8000,'halfway above max: tie to even -> Inf'),(0x7f7fffff,'FLT_MAX -> Inf'),(0xff7fffff,'-FLT_MAX -> -Inf'),
 (0xff7f8000,'-halfway: -Inf'),(0x7f7e8000,'tie below max, even down'),
 (0x00000001,'smallest subnormal float -> +0'),(0x80000001,'-smallest subnormal -> -0'),
 (0x00010000,'smallest bf16 subnormal'),(0x00008000,'tie between 0 and min subnormal -> 0'),(0x00018000,'tie subnormal up to even'),
 (0x00008001,'above half -> min subnormal'),(0x007fffff,'largest float subnormal rounds into min normal'),
 (0x007f8000,'tie: largest subnormal bf16 odd -> min normal'),(0x00800000,'min normal'),
 (0x3effffff,'0.5-: rounds up across exponent'),(0x40490fdb,'pi'),(0xc2f6e979,'-123.456'),
]
for bits,name in cases:
    r = ref(bits)
    print('      {0x%08xu, 0x%04xu},  // %s (%r)' % (bits, r, name, f32(bits)))
