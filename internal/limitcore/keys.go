package limitcore

import (
	"errors"
	"fmt"
)

// FirstKey returns a key function that tries fns in order and returns the
// first key found. A function's error other than one wrapping errNoKey is
// returned at once; if every function returns errNoKey, the errors are
// joined (and with no functions at all, the error wraps errNoKey).
func FirstKey[R any](errNoKey error, fns []func(R) (string, error)) func(R) (string, error) {
	fns = append([]func(R) (string, error)(nil), fns...) // the caller's slice may change
	return func(r R) (string, error) {
		var errs []error
		for _, fn := range fns {
			key, err := fn(r)
			if err == nil {
				return key, nil
			}
			if !errors.Is(err, errNoKey) {
				return "", err
			}
			errs = append(errs, err)
		}
		if len(errs) == 0 {
			return "", fmt.Errorf("%w: no key function given", errNoKey)
		}
		return "", errors.Join(errs...)
	}
}
