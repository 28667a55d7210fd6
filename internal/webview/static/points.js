// Points of the key space. They are 64-bit, more than a Number holds exactly, so they are
// BigInts here and only become fractions to place something on screen.
// Hash points: 16 hex digits; "0000000000000000" as an upper bound means 2^64.
export const TWO64 = 1n << 64n;
const FRAC_BITS = 32n; // fractions become BigInts with this many bits before scaling a range

// A malformed point reads as 0 rather than throwing in the middle of a draw.
export const hexToBig = (h) => (/^[0-9a-fA-F]{1,16}$/.test(h) ? BigInt('0x' + h) : 0n);
export const hiToBig = (h) => { const v = hexToBig(h); return v === 0n ? TWO64 : v; };
export const bigToHex = (v) => (v >= TWO64 ? 0n : v).toString(16).padStart(16, '0');
export const bigFrac = (v) => Number(v) / 2 ** 64;
// The point at fraction f of [lo, hi), computed in BigInt so no hex digit is lost.
export function pointAt(lo, hi, f) {
  const q = BigInt(Math.floor(Math.min(Math.max(f, 0), 1) * 2 ** 32));
  return lo + ((hi - lo) * q) / (1n << FRAC_BITS);
}
// A protojson Range: decimal strings, zero fields omitted.
export function rangeText(r) {
  if (!r) return '';
  const big = (v) => { try { return BigInt(v || 0); } catch (err) { return 0n; } };
  const s = big(r.start);
  const e = r.endOfSpace ? TWO64 : big(r.end);
  return `[${bigToHex(s)}, ${e >= TWO64 ? '2^64' : bigToHex(e)})`;
}
