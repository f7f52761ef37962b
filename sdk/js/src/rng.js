// SplitMix64, bit for bit the Rust and Python SDKs' `Rng`: the same seed gives the same sequence,
// so a strategy ported between languages makes the same decisions. Not cryptographically secure.

const MASK = (1n << 64n) - 1n;
// 2^-53: the top 53 bits of a u64 convert to a float exactly.
const SCALE = 1 / 2 ** 53;

export class Rng {
  /** `seed` may be a BigInt or a Number (the QuickJS runtime hands u64 fields over as Numbers). */
  constructor(seed) {
    this.state = BigInt.asUintN(64, typeof seed === "bigint" ? seed : BigInt(Math.trunc(seed)));
  }

  /** The generator for one request, seeded from the host-supplied `request.seed`. */
  static forRequest(request) {
    return new Rng(request.seed);
  }

  /** The next 64 uniformly distributed bits, as a BigInt. */
  nextU64() {
    this.state = (this.state + 0x9e3779b97f4a7c15n) & MASK;
    let z = this.state;
    z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & MASK;
    z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & MASK;
    return z ^ (z >> 31n);
  }

  /** A uniform float in [0, 1) with 53 random bits (one `nextU64`). */
  nextF64() {
    return Number(this.nextU64() >> 11n) * SCALE;
  }

  /** A uniform integer in [0, bound) without modulo bias, as a Number; 0 when `bound` is 0. */
  below(bound) {
    const b = BigInt(bound);
    if (b <= 0n) return 0;
    // Lemire's multiply-shift with rejection of the biased low range, as the Rust SDK does.
    const threshold = ((-b) & MASK) % b;
    for (;;) {
      const product = this.nextU64() * b;
      if ((product & MASK) >= threshold) return Number(product >> 64n);
    }
  }
}
