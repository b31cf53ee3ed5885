package main

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
)

// The gRPC answers are read with these decoders of the protobuf wire
// format rather than the generated messages' Unmarshal, which builds
// every field only for the generator to look at one (bench/grpc/answer.go
// has the same for sluice). They read only the fields they count, check
// the wire format of the rest as they skip it, and refuse anything they
// cannot read.

// The field numbers read (proto/sluice/v1/sluice.proto, google/rpc/
// status.proto, and gubernator's gubernator.proto).
const (
	decisionAllowed protowire.Number = 1
	decisionPolicy  protowire.Number = 7
	batchResults    protowire.Number = 1
	resultDecision  protowire.Number = 1
	resultError     protowire.Number = 2

	gubResponses protowire.Number = 1 // GetRateLimitsResp.responses
	gubStatus    protowire.Number = 1 // RateLimitResp.status: UNDER_LIMIT 0, OVER_LIMIT 1
	gubLimit     protowire.Number = 2 // RateLimitResp.limit
	gubError     protowire.Number = 5 // RateLimitResp.error
)

// gubernator's RateLimitResp statuses.
const (
	gubUnderLimit = 0
	gubOverLimit  = 1
)

var errWire = errors.New("not the protobuf wire format")

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

// readDecisionProto reads a sluice.v1.Decision. A decision without a
// policy is refused: the service names the policy of every decision.
func readDecisionProto(b []byte) (outcome, error) {
	var o outcome
	var policy bool
	err := fields(b, func(fd field) error {
		switch fd.num {
		case decisionAllowed:
			o.allowed = fd.v != 0
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
	o.decided = err == nil
	return o, err
}

// readTakeProto reads sluice's answer to Take.
func readTakeProto(b []byte, out []outcome) ([]outcome, error) {
	o, err := readDecisionProto(b)
	return append(out[:0], o), err
}

// readTakeBatchProto reads a sluice.v1.TakeBatchResponse into out, one
// outcome per result, in order: a decision, or an error status (not
// decided).
func readTakeBatchProto(b []byte, out []outcome) ([]outcome, error) {
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
				var err error
				o, err = readDecisionProto(fd.data)
				seen = true
				return err
			case resultError:
				o, seen = outcome{}, true
				return fd.want(protowire.BytesType)
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

// readGubernatorProto reads a pb.gubernator.GetRateLimitsResp into out,
// one outcome per response, in order. A response is decided if its error
// is empty, its status one of the two and its limit set (every decided
// response carries the limit it was decided under); an empty message,
// which is what an UNDER_LIMIT of limit 0 would encode to, is not.
func readGubernatorProto(b []byte, out []outcome) ([]outcome, error) {
	out = out[:0]
	err := fields(b, func(fd field) error {
		if fd.num != gubResponses {
			return nil
		}
		if err := fd.want(protowire.BytesType); err != nil {
			return err
		}
		var status, limit uint64
		var failed bool
		err := fields(fd.data, func(fd field) error {
			switch fd.num {
			case gubStatus:
				status = fd.v
				return fd.want(protowire.VarintType)
			case gubLimit:
				limit = fd.v
				return fd.want(protowire.VarintType)
			case gubError:
				failed = len(fd.data) > 0
				return fd.want(protowire.BytesType)
			}
			return nil
		})
		var o outcome
		switch {
		case err != nil, failed:
		case limit == 0:
			err = fmt.Errorf("response %d has no limit", len(out))
		case status == gubUnderLimit:
			o = outcome{decided: true, allowed: true}
		case status == gubOverLimit:
			o = outcome{decided: true}
		default:
			err = fmt.Errorf("response %d has status %d, neither UNDER_LIMIT nor OVER_LIMIT", len(out), status)
		}
		out = append(out, o)
		return err
	})
	return out, err
}

// appendItem appends an encoded message to an encoded message as an
// element of its repeated field 1: TakeBatchRequest.requests or
// GetRateLimitsReq.requests.
func appendItem(list, item []byte) []byte {
	list = protowire.AppendTag(list, 1, protowire.BytesType)
	return protowire.AppendBytes(list, item)
}
