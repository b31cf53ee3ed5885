package loadgen

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice"
)

// Bounds of a workload.
const (
	// MaxKeys is the most distinct keys a run draws from.
	MaxKeys = 1 << 24
	// maxNamedKeys is the most keys whose names are built once, before
	// the run; past it each name is built when it is drawn (about 32
	// bytes a key, so at most 32 MiB of names).
	maxNamedKeys = 1 << 20
)

// The key distributions.
const (
	DistUniform = "uniform" // every key alike
	DistHot     = "hot"     // Keys.HotShare of the requests on the first Keys.HotKeys keys
	DistZipf    = "zipf"    // key i drawn with a weight of 1/(1+i)^ZipfS
)

// Keys says which keys the takes name and how often each: N keys, named
// Prefix followed by 0 to N-1, drawn by Dist.
type Keys struct {
	N      int
	Prefix string
	// Dist is DistUniform, DistHot or DistZipf.
	Dist string
	// ZipfS is the exponent of DistZipf: above 1 (math/rand's Zipf needs
	// it), larger for a steeper skew.
	ZipfS float64
	// HotShare is the share of the requests DistHot sends to the hot keys,
	// 0 to 1; the rest go to the other keys, uniformly.
	HotShare float64
	// HotKeys is the number of hot keys of DistHot, 1 to N; the hot keys
	// are the first ones (key 0 is the hottest of every distribution).
	HotKeys int
}

func (k Keys) check() error {
	switch {
	case k.N < 1 || k.N > MaxKeys:
		return fmt.Errorf("%w: %d keys: want 1 to %d", sluice.ErrInvalidOption, k.N, MaxKeys)
	case k.Dist != DistUniform && k.Dist != DistHot && k.Dist != DistZipf:
		return fmt.Errorf("%w: key distribution %q: want %s, %s or %s", sluice.ErrInvalidOption, k.Dist, DistUniform, DistHot, DistZipf)
	case k.Dist == DistZipf && !(k.ZipfS > 1 && k.ZipfS <= 100):
		return fmt.Errorf("%w: zipf exponent %v: want above 1, at most 100", sluice.ErrInvalidOption, k.ZipfS)
	case k.Dist == DistHot && !(k.HotShare >= 0 && k.HotShare <= 1):
		return fmt.Errorf("%w: hot share %v: want 0 to 1", sluice.ErrInvalidOption, k.HotShare)
	case k.Dist == DistHot && (k.HotKeys < 1 || k.HotKeys > k.N):
		return fmt.Errorf("%w: %d hot keys: want 1 to the number of keys (%d)", sluice.ErrInvalidOption, k.HotKeys, k.N)
	}
	// The longest key must be one a store takes.
	if err := sluice.ValidateKey(k.Prefix + strconv.Itoa(k.N-1)); err != nil {
		return fmt.Errorf("key prefix of %d bytes: %w", len(k.Prefix), err)
	}
	return nil
}

// String describes the distribution: "1000 keys, zipf s=1.1".
func (k Keys) String() string {
	s := strconv.Itoa(k.N) + " keys, " + k.Dist
	switch k.Dist {
	case DistZipf:
		s += " s=" + strconv.FormatFloat(k.ZipfS, 'g', -1, 64)
	case DistHot:
		s += fmt.Sprintf(" (%g%% on %d)", 100*k.HotShare, k.HotKeys)
	}
	return s
}

// Name returns the name of key i.
func (k Keys) Name(i int) string { return k.Prefix + strconv.Itoa(i) }

// keySpace draws keys of a Keys. Its names are shared by the request
// slots, read only.
type keySpace struct {
	k     Keys
	names []string // nil past maxNamedKeys
}

func newKeySpace(k Keys) *keySpace {
	ks := &keySpace{k: k}
	if k.N <= maxNamedKeys {
		ks.names = make([]string, k.N)
		for i := range ks.names {
			ks.names[i] = k.Name(i)
		}
	}
	return ks
}

func (ks *keySpace) name(i int) string {
	if ks.names != nil {
		return ks.names[i]
	}
	return ks.k.Name(i)
}

// keyPicker draws key indexes for one request slot, from the slot's own
// random source.
type keyPicker struct {
	k    Keys
	rng  *rand.Rand
	zipf *rand.Zipf
}

func (ks *keySpace) picker(rng *rand.Rand) *keyPicker {
	p := &keyPicker{k: ks.k, rng: rng}
	if ks.k.Dist == DistZipf && ks.k.N > 1 {
		p.zipf = rand.NewZipf(rng, ks.k.ZipfS, 1, uint64(ks.k.N-1))
	}
	return p
}

func (p *keyPicker) next() int {
	switch {
	case p.k.N == 1:
		return 0
	case p.zipf != nil:
		return int(p.zipf.Uint64())
	case p.k.Dist == DistHot:
		if p.k.HotKeys == p.k.N || p.rng.Float64() < p.k.HotShare {
			return p.rng.IntN(p.k.HotKeys)
		}
		return p.k.HotKeys + p.rng.IntN(p.k.N-p.k.HotKeys)
	}
	return p.rng.IntN(p.k.N)
}

// MaxCost bounds a take's cost.
const MaxCost = 1 << 40

// Costs is the cost of each take: drawn uniformly from Min to Max, both
// included (Min == Max: always that cost).
type Costs struct {
	Min, Max int64
}

func (c Costs) check() error {
	if c.Min < 1 || c.Max < c.Min || c.Max > MaxCost {
		return fmt.Errorf("%w: costs %d to %d: want 1 <= min <= max <= %d", sluice.ErrInvalidOption, c.Min, c.Max, int64(MaxCost))
	}
	return nil
}

// String is "1" for a fixed cost, "uniform:1-5" for a range.
func (c Costs) String() string {
	if c.Min == c.Max {
		return strconv.FormatInt(c.Min, 10)
	}
	return fmt.Sprintf("uniform:%d-%d", c.Min, c.Max)
}

func (c Costs) draw(rng *rand.Rand) int64 {
	if c.Min == c.Max {
		return c.Min
	}
	return c.Min + rng.Int64N(c.Max-c.Min+1)
}

// ParseCosts parses a cost distribution: "uniform:A-B" draws each cost
// uniformly from A to B, both included. The error wraps
// sluice.ErrInvalidOption.
func ParseCosts(s string) (Costs, error) {
	bad := fmt.Errorf("%w: cost distribution %q: want uniform:MIN-MAX, as uniform:1-5", sluice.ErrInvalidOption, s)
	rest, ok := strings.CutPrefix(s, "uniform:")
	if !ok {
		return Costs{}, bad
	}
	lo, hi, ok := strings.Cut(rest, "-")
	if !ok {
		return Costs{}, bad
	}
	a, err1 := strconv.ParseInt(lo, 10, 64)
	b, err2 := strconv.ParseInt(hi, 10, 64)
	if err1 != nil || err2 != nil {
		return Costs{}, bad
	}
	c := Costs{Min: a, Max: b}
	if err := c.check(); err != nil {
		return Costs{}, fmt.Errorf("cost distribution %q: %w", s, err)
	}
	return c, nil
}
