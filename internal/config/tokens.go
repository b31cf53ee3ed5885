package config

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"strings"

	"github.com/sluicehq/sluice"
)

// Bounds on a bearer token, in bytes.
const (
	MinTokenLen = 16
	MaxTokenLen = 4096
)

// ParseTokens reads the bearer tokens of the HTTP API from the contents of
// the file auth.bearer_tokens_file names, or from the value of the
// environment variable auth.bearer_tokens_env names. Tokens are separated
// by new lines or commas, white space around them is dropped, and empty
// entries and lines starting with # are skipped. Each token is MinTokenLen
// to MaxTokenLen bytes of the token68 alphabet that an Authorization:
// Bearer header carries (RFC 6750): ASCII letters, digits, - . _ ~ + /,
// then optional trailing '='. At least one token is required; a token given
// twice counts once. The error wraps ErrInvalid and names the line and
// entry, never a token.
func ParseTokens(text string) ([]string, error) {
	var tokens []string
	var errs []*Error
	seen := map[string]bool{}
	for n, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		entries := strings.Split(line, ",")
		for i, t := range entries {
			t = strings.TrimSpace(t)
			if t == "" {
				continue
			}
			if msg := checkToken(t); msg != "" {
				which := "the token"
				if len(entries) > 1 {
					which = fmt.Sprintf("token %d of the line", i+1)
				}
				errs = append(errs, &Error{Line: n + 1, Msg: which + " " + msg})
				continue
			}
			if !seen[t] {
				seen[t] = true
				tokens = append(tokens, t)
			}
		}
	}
	if len(errs) == 0 && len(tokens) == 0 {
		errs = append(errs, &Error{Msg: "no bearer token is given; want one token per line (or separated by commas)"})
	}
	if len(errs) > 0 {
		return nil, join(errs)
	}
	return tokens, nil
}

func checkToken(t string) string {
	if len(t) < MinTokenLen || len(t) > MaxTokenLen {
		return fmt.Sprintf("is %d bytes long; want %d to %d (for example 32 random bytes in hex or base64)", len(t), MinTokenLen, MaxTokenLen)
	}
	body := strings.TrimRight(t, "=")
	if body == "" {
		return "is only '=' characters"
	}
	for i := 0; i < len(body); i++ {
		c := body[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-._~+/", c) >= 0) {
			return fmt.Sprintf("has a byte at offset %d outside the token alphabet (ASCII letters, digits, - . _ ~ + /, then trailing =)", i)
		}
	}
	return ""
}

// Bearer checks the bearer tokens of a request against the configured
// ones, for every API of the service. The zero Bearer has no tokens:
// Enabled is false.
type Bearer struct {
	sums [][sha256.Size]byte
}

// NewBearer returns the check of tokens; none means no authentication. An
// empty token is refused.
func NewBearer(tokens []string) (Bearer, error) {
	var b Bearer
	for i, t := range tokens {
		if t == "" {
			return Bearer{}, fmt.Errorf("%w: bearer token %d is empty", sluice.ErrInvalidOption, i+1)
		}
		b.sums = append(b.sums, sha256.Sum256([]byte(t)))
	}
	return b, nil
}

// Enabled reports whether requests need a token.
func (b Bearer) Enabled() bool { return len(b.sums) > 0 }

// Authorized reports whether value, an Authorization header or
// authorization metadata, is "Bearer " and one of the tokens. It compares
// with every token in time that depends on neither: both sides are hashed
// first, so that not even a token's length shows.
func (b Bearer) Authorized(value string) bool {
	token, ok := strings.CutPrefix(value, "Bearer ")
	if !ok || token == "" {
		return false
	}
	sum := sha256.Sum256([]byte(token))
	match := 0
	for i := range b.sums {
		match |= subtle.ConstantTimeCompare(sum[:], b.sums[i][:])
	}
	return match == 1
}
