package main

import (
	"errors"
	"fmt"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protowire"
)

// The raw client reads the answers with these decoders of the protobuf
// wire format rather than the generated messages' Unmarshal, which builds
// every field of a Decision (its policy, limit and durations) only for the
// generator to look at one. They read only the fields they count
// (Decision.allowed and .policy, a batch result's decision or its
// google.rpc.Status code, a RateLimitResponse's overall code and its
// statuses' codes and current limits), check the wire format of the rest
// as they skip it, and refuse anything they cannot read.

// The field numbers read (proto/sluice/v1/sluice.proto, Envoy's rls.proto,
// google/rpc/status.proto).
const (
	decisionAllowed  protowire.Number = 1
	decisionPolicy   protowire.Number = 7
	batchResults     protowire.Number = 1
	resultDecision   protowire.Number = 1
	resultError      protowire.Number = 2
	statusCode       protowire.Number = 1
	envoyOverall     protowire.Number = 1
	envoyStatuses    protowire.Number = 2
	envoyStatusCode  protowire.Number = 1
	envoyStatusLimit protowire.Number = 2
)

var errWire = errors.New("not the protobuf wire format")

// outcome is what one take of a batch came to.
type outcome struct {
	decided bool // allowed or denied; otherwise code is the error's
	allowed bool
	code    codes.Code
}

// field is one field of a message: a varint's value, or a length-delimited
// field's bytes.
type field struct {
	num  protowire.Number
	typ  protowire.Type
	v    uint64
	data []byte
}

// fields calls f with each field of the message b, in order.
func fields(b []byte, f func(field) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("%w: %v", errWire, protowire.ParseError(n))
		}
		b = b[n:]
		fd := field{num: num, typ: typ}
		switch typ {
		case protowire.VarintType:
			fd.v, n = protowire.ConsumeVarint(b)
		case protowire.BytesType:
			fd.data, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return fmt.Errorf("%w: field %d: %v", errWire, num, protowire.ParseError(n))
		}
		b = b[n:]
		if err := f(fd); err != nil {
			return err
		}
	}
	return nil
}

// want checks that fd, a field the decoders read, has the wire type of its
// declaration.
func (fd field) want(typ protowire.Type) error {
	if fd.typ != typ {
		return fmt.Errorf("%w: field %d has wire type %d, want %d", errWire, fd.num, fd.typ, typ)
	}
	return nil
}

// readDecision reads a sluice.v1.Decision and returns whether it allowed.
// A decision without a policy is refused: the service names the policy of
// every decision, so an answer without one is not a decision.
func readDecision(b []byte) (bool, error) {
	var allowed, policy bool
	err := fields(b, func(fd field) error {
		switch fd.num {
		case decisionAllowed:
			allowed = fd.v != 0
			return fd.want(protowire.VarintType)
		case decisionPolicy:
			policy = len(fd.data) > 0
			return fd.want(protowire.BytesType)
		}
		return nil
	})
	if err == nil && !policy {
		err = errors.New("a decision without a policy")
	}
	return allowed, err
}

// readBatch reads a sluice.v1.TakeBatchResponse into out, one outcome per
// result, in order.
func readBatch(b []byte, out []outcome) ([]outcome, error) {
	out = out[:0]
	err := fields(b, func(fd field) error {
		if fd.num != batchResults {
			return nil
		}
		if err := fd.want(protowire.BytesType); err != nil {
			return err
		}
		var o outcome
		seen := false
		err := fields(fd.data, func(fd field) error {
			switch fd.num {
			case resultDecision:
				if err := fd.want(protowire.BytesType); err != nil {
					return err
				}
				allowed, err := readDecision(fd.data)
				o, seen = outcome{decided: true, allowed: allowed}, true
				return err
			case resultError:
				if err := fd.want(protowire.BytesType); err != nil {
					return err
				}
				code, err := readStatus(fd.data)
				o, seen = outcome{code: code}, true
				return err
			}
			return nil
		})
		if err == nil && !seen {
			err = fmt.Errorf("result %d is neither a decision nor an error", len(out))
		}
		out = append(out, o)
		return err
	})
	return out, err
}

// readStatus reads the code of a google.rpc.Status. An error status of
// code OK is refused.
func readStatus(b []byte) (codes.Code, error) {
	var code codes.Code
	err := fields(b, func(fd field) error {
		if fd.num != statusCode {
			return nil
		}
		code = codes.Code(uint32(fd.v))
		return fd.want(protowire.VarintType)
	})
	if err == nil && code == codes.OK {
		err = errors.New("an error status of code OK")
	}
	return code, err
}

// readEnvoy reads an Envoy RateLimitResponse: its overall code, the
// number of its statuses, and the code of the first and whether it has a
// current limit.
func readEnvoy(b []byte) (envoyAnswer, error) {
	var a envoyAnswer
	err := fields(b, func(fd field) error {
		switch fd.num {
		case envoyOverall:
			a.overall = rlsv3.RateLimitResponse_Code(int32(fd.v))
			return fd.want(protowire.VarintType)
		case envoyStatuses:
			if err := fd.want(protowire.BytesType); err != nil {
				return err
			}
			a.statuses++
			first := a.statuses == 1
			return fields(fd.data, func(fd field) error {
				switch {
				case fd.num == envoyStatusCode:
					if first {
						a.code = rlsv3.RateLimitResponse_Code(int32(fd.v))
					}
					return fd.want(protowire.VarintType)
				case fd.num == envoyStatusLimit:
					a.matched = a.matched || first
					return fd.want(protowire.BytesType)
				}
				return nil
			})
		}
		return nil
	})
	return a, err
}
