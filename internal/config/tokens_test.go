package config

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestParseTokens(t *testing.T) {
	const a = "0123456789abcdef0123456789abcdef"
	const b = "dG9rZW4tYi1mb3ItdGVzdHM="
	tests := []struct {
		name string
		text string
		want []string
		errs []string // the problems' messages, in order
	}{
		{"one", a, []string{a}, nil},
		{"lines", "# the API tokens\n" + a + "\n\n  " + b + "  \r\n", []string{a, b}, nil},
		{"commas", a + ", " + b + ",", []string{a, b}, nil},
		{"twice", a + "\n" + a, []string{a}, nil},
		{"token68 alphabet", "Ab-._~+/09zZ-._~+/==", []string{"Ab-._~+/09zZ-._~+/=="}, nil},
		{"empty", "", nil, []string{"no bearer token is given"}},
		{"only comments", "# none yet\n\n", nil, []string{"no bearer token is given"}},
		{"short", "short-token-1234\nshort", nil, []string{"line 2: the token is 5 bytes long; want 16 to 4096"}},
		{"long", strings.Repeat("x", 4097), nil, []string{"line 1: the token is 4097 bytes long"}},
		{"space inside", "0123456789 abcdef0123", nil, []string{"line 1: the token has a byte at offset 10 outside the token alphabet"}},
		{"second of a line", a + ",secret:value:123456", nil, []string{"line 1: token 2 of the line has a byte at offset 6 outside"}},
		{"only equals", "================", nil, []string{"line 1: the token is only '=' characters"}},
		{"several problems", "tiny\n" + a + "\nbad token with spaces", nil, []string{"line 1: the token is 4 bytes", "line 3: the token has a byte"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseTokens(tt.text)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ParseTokens = %q, want %q", got, tt.want)
			}
			problems := Errors(err)
			if len(problems) != len(tt.errs) {
				t.Fatalf("ParseTokens error = %v, want %d problems %q", err, len(tt.errs), tt.errs)
			}
			for i, p := range problems {
				if !strings.Contains(p.Error(), tt.errs[i]) {
					t.Errorf("problem %d = %q, want it to contain %q", i, p.Error(), tt.errs[i])
				}
			}
			if err != nil {
				if !errors.Is(err, ErrInvalid) {
					t.Errorf("ParseTokens error %v does not wrap ErrInvalid", err)
				}
				for _, secret := range []string{"secret:value", "spaces", "tiny", "short\n"} {
					if strings.Contains(err.Error(), strings.TrimSpace(secret)) && strings.Contains(tt.text, secret) {
						t.Errorf("ParseTokens error %q shows a token", err)
					}
				}
			}
		})
	}
}

func TestBearer(t *testing.T) {
	b, err := NewBearer([]string{"first-token-0123456789", "second-token-0123456789"})
	if err != nil || !b.Enabled() {
		t.Fatalf("NewBearer = %v, %v", b, err)
	}
	for value, want := range map[string]bool{
		"Bearer first-token-0123456789":  true,
		"Bearer second-token-0123456789": true,
		"Bearer first-token-012345678":   false,
		"bearer first-token-0123456789":  false,
		"first-token-0123456789":         false,
		"Bearer ":                        false,
		"":                               false,
	} {
		if got := b.Authorized(value); got != want {
			t.Errorf("Authorized(%q) = %v, want %v", value, got, want)
		}
	}
	if (Bearer{}).Enabled() {
		t.Error("the zero Bearer is enabled")
	}
	if _, err := NewBearer([]string{"ok-token-0123456789", ""}); err == nil || !strings.Contains(err.Error(), "token 2 is empty") {
		t.Errorf("NewBearer with an empty token = %v", err)
	}
}
