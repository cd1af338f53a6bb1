package relaytest

import (
	byteorder "encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

// Unread is how many bytes the kernel holds for the TCP socket whose own
// address is local and whose peer is remote that its owner has not read
// yet (rx_queue in /proc/net/tcp and tcp6), and whether that socket exists.
// A test polls it to know that a server has taken in what was sent to it
// (Unread(c.RemoteAddr(), c.LocalAddr()) reaching 0 for the test's end c),
// or that bytes are waiting at a peer that holds them.
func Unread(local, remote net.Addr) (int, bool) {
	l, err := netip.ParseAddrPort(local.String())
	if err != nil {
		return 0, false
	}
	r, err := netip.ParseAddrPort(remote.String())
	if err != nil {
		return 0, false
	}
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(file)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 5 {
				continue
			}
			fl, errL := procAddr(f[1])
			fr, errR := procAddr(f[2])
			if errL != nil || errR != nil || fl != unmap(l) || fr != unmap(r) {
				continue
			}
			_, rx, ok := strings.Cut(f[4], ":")
			if !ok {
				continue
			}
			n, err := strconv.ParseUint(rx, 16, 32)
			if err != nil {
				continue
			}
			return int(n), true
		}
	}
	return 0, false
}

func unmap(a netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
}

// procAddr parses /proc/net/tcp's ADDR:PORT: the address in hex, as 32-bit
// words in the host's byte order (little-endian here), the port in hex.
func procAddr(s string) (netip.AddrPort, error) {
	h, p, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("no port in %q", s)
	}
	raw, err := hex.DecodeString(h)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, fmt.Errorf("address %q", h)
	}
	for i := 0; i < len(raw); i += 4 {
		byteorder.BigEndian.PutUint32(raw[i:], byteorder.LittleEndian.Uint32(raw[i:]))
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.AddrPort{}, err
	}
	addr, _ := netip.AddrFromSlice(raw)
	return netip.AddrPortFrom(addr.Unmap(), uint16(port)), nil
}
