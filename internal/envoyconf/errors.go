package envoyconf

import (
	"errors"
	"fmt"

	"github.com/sluicehq/sluice/internal/config"
)

// ErrInvalid is wrapped by every error that says a rate-limit
// configuration is wrong (each *Error): the service config's sentinel,
// since the rules are part of the service's configuration. It wraps
// sluice.ErrInvalidOption.
var ErrInvalid = config.ErrInvalid

// Error is one problem of a configuration file, of the same type as the
// service config's (config.Error): File is the rule file, Path names the
// value in it, as in "descriptors[0].rate_limit.unit". Parse and Load
// return every problem they find (up to MaxProblems), joined with
// errors.Join; each wraps ErrInvalid and, where one caused it, the error of
// the check that failed.
type Error = config.Error

// Errors returns the problems err holds: the *Error values that Parse or
// Load joined, in order. It returns nil for nil or an error of another
// kind.
func Errors(err error) []*Error { return config.Errors(err) }

// join returns errs as one error, nil if there are none. Past MaxProblems
// a last problem says how many more there are.
func join(errs []*Error) error {
	if len(errs) == 0 {
		return nil
	}
	if n := len(errs); n > MaxProblems {
		errs = append(errs[:MaxProblems:MaxProblems], &Error{Msg: fmt.Sprintf("and %d more problems, not shown", n-MaxProblems)})
	}
	list := make([]error, len(errs))
	for i, e := range errs {
		list[i] = e
	}
	return errors.Join(list...)
}
