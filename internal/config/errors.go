package config

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/sluicehq/sluice"
)

// ErrInvalid is wrapped by every error that says a configuration is wrong
// (each *Error). It wraps sluice.ErrInvalidOption.
var ErrInvalid = fmt.Errorf("%w: invalid config", sluice.ErrInvalidOption)

// Error is one problem of a configuration. Parse, Load and Validate return
// every problem they find, each an *Error, joined with errors.Join; each
// wraps ErrInvalid and, where one caused it, the error of the check that
// failed (sluice.ErrInvalidLimit from ParseLimit, for example).
type Error struct {
	// File is the config file's path, when Load read it.
	File string
	// Line is the line of the file the problem is on (of the key, for a
	// key and its value), from 1; 0 if there is none (a Config built in
	// code, a YAML syntax error that names no line).
	Line int
	// Path names the field, as in "policies.login.limits[1]"; empty for
	// the file as a whole.
	Path string
	// Msg says what is wrong: the bad value (never a secret) and the
	// values allowed.
	Msg string
	// Err is the underlying error, or nil.
	Err error
}

// Error formats e as "FILE:LINE: PATH: MSG", leaving out what is not known
// ("line LINE: PATH: MSG" without a file).
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

// Errors returns the problems err holds: the *Error values that Parse,
// Load or Validate joined, in order. It returns nil for nil or an error of
// another kind (a file that cannot be read).
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

func join(errs []*Error) error {
	if len(errs) == 0 {
		return nil
	}
	list := make([]error, len(errs))
	for i, e := range errs {
		list[i] = e
	}
	return errors.Join(list...)
}
