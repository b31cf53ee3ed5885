package sluice

import "fmt"

// Conversion says how the level of a bucket carries over when a request of
// its policy arrives with a limit other than the one the bucket was last
// decided under (a customer moved to another tier, a changed config). The
// bucket is first refilled under its old limit up to now; the conversion
// then always rounds down and never leaves more than the new capacity. A
// bucket that was full under the old limit is full under the new one,
// whatever the conversion.
type Conversion uint8

const (
	// KeepTokens keeps the level, clamped to the new capacity. The default.
	KeepTokens Conversion = iota
	// ScaleTokens keeps the level's fraction of capacity:
	// new level = old level * new capacity / old capacity.
	ScaleTokens
	// ResetTokens starts the bucket full under the new limit.
	ResetTokens
)

// String returns "keep", "scale" or "reset", the names ParseConversion reads.
func (c Conversion) String() string {
	switch c {
	case KeepTokens:
		return "keep"
	case ScaleTokens:
		return "scale"
	case ResetTokens:
		return "reset"
	}
	return fmt.Sprintf("Conversion(%d)", uint8(c))
}

// ParseConversion returns the Conversion named "keep", "scale" or "reset".
// The error wraps ErrInvalidOption.
func ParseConversion(s string) (Conversion, error) {
	switch s {
	case "keep":
		return KeepTokens, nil
	case "scale":
		return ScaleTokens, nil
	case "reset":
		return ResetTokens, nil
	}
	return 0, fmt.Errorf("%w: limit-change conversion %q is unknown; use \"keep\", \"scale\" or \"reset\"", ErrInvalidOption, s)
}

// Validate reports whether c is one of the defined conversions. The error
// wraps ErrInvalidOption.
func (c Conversion) Validate() error {
	if c > ResetTokens {
		return fmt.Errorf("%w: limit-change conversion %d is unknown; use KeepTokens, ScaleTokens or ResetTokens", ErrInvalidOption, uint8(c))
	}
	return nil
}
