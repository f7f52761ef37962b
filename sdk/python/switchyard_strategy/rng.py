"""A small deterministic random number generator (the Rust SDK's `Rng`, bit for bit)."""

_MASK = (1 << 64) - 1
# 2^-53: the top 53 bits of a u64 convert to a float exactly.
_SCALE = 1.0 / (1 << 53)


class Rng:
    """SplitMix64: seedable, fast, and the same sequence as the Rust and JavaScript SDKs for the
    same seed, so a strategy ported between languages makes the same decisions. Not
    cryptographically secure."""

    __slots__ = ("state",)

    def __init__(self, seed: int) -> None:
        self.state = seed & _MASK

    @classmethod
    def for_request(cls, request) -> "Rng":
        """The generator for one request, seeded from the host-supplied `request.seed`, so a
        decision is reproducible from its inputs."""
        return cls(request.seed)

    def next_u64(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & _MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return z ^ (z >> 31)

    def next_f64(self) -> float:
        """A uniform float in [0, 1) with 53 random bits (one `next_u64`)."""
        return (self.next_u64() >> 11) * _SCALE

    def below(self, bound: int) -> int:
        """A uniform integer in [0, bound) without modulo bias; 0 when `bound` is 0."""
        if bound <= 0:
            return 0
        # Lemire's multiply-shift with rejection of the biased low range, as the Rust SDK does.
        threshold = ((-bound) & _MASK) % bound
        while True:
            product = self.next_u64() * bound
            if (product & _MASK) >= threshold:
                return product >> 64

    def __eq__(self, other) -> bool:
        return isinstance(other, Rng) and other.state == self.state

    def __repr__(self) -> str:
        return f"Rng(state={self.state:#x})"
