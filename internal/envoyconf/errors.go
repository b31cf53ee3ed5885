package envoyconf

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/sluicehq/sluice"
)

// ErrInvalid is wrapped by every error that says a rate-limit
// configuration is wrong (each *Error). It wraps sluice.ErrInvalidOption.
var ErrInvalid = fmt.Errorf("%w: invalid envoy rate-limit config", sluice.ErrInvalidOption)

// Error is one problem of a configuration file. Parse and Load return
// every problem they find (up to MaxProblems), each an *Error, joined with
// errors.Join; each wraps ErrInvalid and, where one caused it, the error of
// the check that failed.
type Error struct {
	// File is the file's path (the name given to Parse); empty for a
	// problem of no one file.
	File string
	// Line is the line of the file the problem is on, from 1; 0 if there
	// is none.
	Line int
	// Path names the value in the file, as in
	// "descriptors[0].rate_limit.unit"; empty for the file as a whole.
	Path string
	// Msg says what is wrong: the bad value and the values allowed.
	Msg string
	// Err is the underlying error, or nil.
	Err error
}

// Error formats e as "FILE:LINE: PATH: MSG", leaving out what is not
// known.
func (e *Error) Error() string {
	var s string
	switch {
	case e.File != "" && e.Line > 0:
		s = e.File + ":" + strconv.Itoa(e.Line) + ": "
	case e.File != "":
		s = e.File + ": "
	case e.Line > 0:
		s = "line " + strconv.Itoa(e.Line) + ": "
	}
	if e.Path != "" {
		s += e.Path + ": "
	}
	return s + e.Msg
}

// Unwrap returns ErrInvalid and the underlying error, if any.
func (e *Error) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrInvalid, e.Err}
	}
	return []error{ErrInvalid}
}

// Errors returns the problems err holds: the *Error values that Parse or
// Load joined, in order. It returns nil for nil or an error of another
// kind.
func Errors(err error) []*Error {
	var out []*Error
	var walk func(error)
	walk = func(err error) {
		switch e := err.(type) {
		case *Error:
			out = append(out, e)
		case interface{ Unwrap() []error }:
			for _, x := range e.Unwrap() {
				walk(x)
			}
		}
	}
	walk(err)
	return out
}

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
