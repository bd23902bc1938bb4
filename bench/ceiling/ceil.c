// ceil.c: how fast can two processes on this host move 64 KiB messages
// over loopback, by the means the tcp and roce transports use? A ceiling
// for bench/roce-vs-tcp.sh: no RDMA protocol, no Go runtime, just the
// system calls and the per-byte work each transport cannot avoid.
//
//   ceil tcp    N   one TCP stream (TCP_NODELAY): writev of up to 128
//                   messages (header, 64 KiB) at a time, gathered from the
//                   source region; the receiver's readv takes a payload in place
//                   (into the destination "memory region") and the next header
//                   (CEIL_LOWAT=1: SO_RCVLOWAT at what that readv wants, at
//                   most 64 KiB); the sender spins on a non-blocking socket.
//   ceil udp    N   datagrams of 12 B header + 4096 B payload + 4 B trailer
//                   (the shape of a RoCEv2 RDMA WRITE_MIDDLE without IP/UDP),
//                   sent as UDP GSO messages (UDP_SEGMENT, 15 datagrams each)
//                   with sendmmsg, the payload gathered from the source region
//                   (no copy in user space), received with UDP_GRO and
//                   recvmmsg (64 buffers of 64 KiB); the receiver only looks
//                   at the headers. Flow control as the roce transport's: a
//                   window of 1024 datagrams, the receiver acknowledges every
//                   256 (a 16-byte datagram back).
//   ceil udpcrc N   udp, plus a CRC-32 (IEEE) over header and payload of every
//                   datagram on both sides (the sender writes it in the
//                   trailer, the receiver checks it), plus the receiver's one
//                   copy of each payload into place in its region.
//   ceil udpcopy N  udp plus the receiver's copy, no CRC: what udpcrc would
//                   reach with a CRC that cost nothing.
//   ceil crc    N   the CRC alone: N x 64 KiB through the chosen one.
//
// The source and destination regions are 64 KiB, used by every message as
// rdmakit perf uses its buffers (CEIL_REGION for larger ones). The sender
// starts its clock once the receiver has touched its region. Other knobs:
// CEIL_SPIN, CEIL_TCPBATCH, CEIL_TCPBUF, CEIL_CONNECT, CEIL_WINDOW,
// CEIL_ACKEVERY (see where each is read).
//
// The CRC is crcfold.h's (AVX-512 VPCLMULQDQ folding, 256 bytes a step;
// checked against zlib at start) where the CPU has it, else libdeflate's
// when libdeflate.so.0 loads, else zlib's; CEIL_CRC=libdeflate or zlib
// picks one.
// Prints one line: "MODE MiB/s" (bandwidth of N x 64 KiB from the first
// send to the last acknowledgement, 2^20 bytes per MiB), then the CPU time
// (user + system) each side used per 64 KiB over the same span.
//
// Build: gcc -O2 -o ceil ceil.c -lz -ldl
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <netinet/udp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "crcfold.h"

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

enum {
	MSG = 65536,          // message size
	PAY = 4096,           // payload per datagram (IB MTU 4096)
	HDR = 12,             // header (a BTH's size)
	TRL = 4,              // trailer (the ICRC's size)
	DGRAM = HDR + PAY + TRL,
	PPM = MSG / PAY,      // datagrams per message
	GSOSEG = 15,          // datagrams per GSO message (15 * 4112 < 64 KB)
	BATCH = 64,           // sendmmsg / recvmmsg vector length
};

// window: datagrams in flight (CEIL_WINDOW, default 1024, as the roce
// transport's); the receiver acknowledges every window/4; socket buffers
// are 8 KiB per datagram of the window (8 MiB by default, as roce's).
static long window = 1024;

// REGION: the source and destination regions' size (CEIL_REGION bytes, a
// multiple of 64 KiB; by default 64 KiB, one message, reused by every
// message as rdmakit perf and perftest do, so it stays in the cache).
static long REGION = MSG;
// ackevery: the receiver acknowledges once this many datagrams are owed
// (window/4; CEIL_ACKEVERY=1: after every receive batch, as the roce
// transport's responder does when its socket runs dry).
static long ackevery;

// spinS, spinR: the sender, the receiver waits by spinning on non-blocking
// calls (sched_yield between tries), as rdmakit's pollers do, rather than
// sleeping in the kernel (CEIL_SPIN=s, r, sr or none; by default the TCP
// sender spins, everything else sleeps: the fastest here).
static int spinS, spinR;

// tcpbuf: the TCP sockets' buffer sizes (CEIL_TCPBUF bytes; 0, the default,
// leaves the kernel's autotuning).
static int tcpbuf;

static uint32_t (*crcfn)(uint32_t, const void *, size_t);
static const char *crcname = "zlib";

static uint32_t zcrc(uint32_t c, const void *p, size_t n) { return crc32(c, p, n); }

static void pickcrc(void) {
	crcfn = zcrc;
	const char *e = getenv("CEIL_CRC");
	if (e && strcmp(e, "zlib") == 0)
		return;
	__builtin_cpu_init();
	if ((!e || strcmp(e, "fold") == 0) && __builtin_cpu_supports("avx512f") &&
		__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("vpclmulqdq")) {
		// check it against zlib before trusting it
		static uint8_t b[9000];
		for (size_t i = 0; i < sizeof b; i++)
			b[i] = (uint8_t)(i * 131 + (i >> 7));
		for (size_t n = 0; n <= sizeof b; n += 97)
			if (crcfold(0x1234567, b + 3, n > sizeof b - 3 ? sizeof b - 3 : n) !=
				(uint32_t)crc32(0x1234567, b + 3, n > sizeof b - 3 ? sizeof b - 3 : n)) {
				fprintf(stderr, "crcfold disagrees with zlib at %zu bytes\n", n);
				exit(2);
			}
		crcfn = crcfold;
		crcname = "fold";
		return;
	}
	void *h = dlopen("libdeflate.so.0", RTLD_NOW);
	if (!h)
		return;
	void *f = dlsym(h, "libdeflate_crc32");
	if (f) {
		crcfn = (uint32_t (*)(uint32_t, const void *, size_t))f;
		crcname = "libdeflate";
	}
}

// cpu: this process's (who = RUSAGE_SELF) or its waited-for children's
// user+system seconds.
static double cpu(int who) {
	struct rusage u;
	getrusage(who, &u);
	return u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + u.ru_stime.tv_sec + u.ru_stime.tv_usec * 1e-6;
}

static double now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

static void die(const char *what) {
	perror(what);
	exit(2);
}

static void setbufs(int fd, int v) {
	if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &v, sizeof v) < 0)
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof v);
	if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &v, sizeof v) < 0)
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof v);
}

static char *region(void) {
	char *r = aligned_alloc(4096, REGION);
	if (!r)
		die("alloc");
	for (long i = 0; i < REGION; i += 64)
		r[i] = (char)i;
	return r;
}

// spawn forks the receiver; the sender starts its clock only once the
// receiver has said (ready) that its region is allocated and touched.
static int readyfd[2];

static pid_t spawn(void) {
	if (pipe(readyfd) < 0)
		die("pipe");
	return fork();
}

// cpuS, cpuR: CPU seconds of the sender and the receiver from ready to the
// end (the receiver reports its own with done).
static double cpuS, cpuR, cpu0;

static void ready(void) {
	char b = 1;
	cpu0 = cpu(RUSAGE_SELF);
	if (write(readyfd[1], &b, 1) != 1)
		die("ready");
}

static void done(void) {
	double c = cpu(RUSAGE_SELF) - cpu0;
	if (write(readyfd[1], &c, sizeof c) != sizeof c)
		die("done");
}

static void collect(void) {
	cpuS = cpu(RUSAGE_SELF) - cpu0;
	if (read(readyfd[0], &cpuR, sizeof cpuR) != sizeof cpuR)
		cpuR = -1;
}

static void awaitready(void) {
	char b;
	if (read(readyfd[0], &b, 1) != 1)
		die("await ready");
	cpu0 = cpu(RUSAGE_SELF);
}

// ---- tcp ----

// readvfull reads all of v[0..n) (advancing the vector). With lowat, it
// keeps the socket's SO_RCVLOWAT at what is left to read, so that the
// reader wakes once when it can all be read rather than per segment (the
// tcp transport does the same while it reads a payload).
static int curlowat = 1;

static void readvfull(int fd, struct iovec *v, int n, int lowat) {
	for (;;) {
		while (n && v->iov_len == 0)
			v++, n--;
		if (!n)
			return;
		if (lowat) {
			int want = 0;
			for (int j = 0; j < n; j++)
				want += v[j].iov_len;
			if (want > MSG)
				want = MSG; // the tcp transport's SO_RCVLOWAT is at most a payload chunk
			if (want != curlowat && setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof want) == 0)
				curlowat = want;
		}
		ssize_t k = readv(fd, v, n);
		if (k < 0 && errno == EAGAIN) {
			sched_yield();
			continue;
		}
		if (k <= 0)
			die("tcp readv");
		for (int j = 0; j < n && k; j++) {
			size_t d = (size_t)k < v[j].iov_len ? (size_t)k : v[j].iov_len;
			v[j].iov_base = (char *)v[j].iov_base + d, v[j].iov_len -= d, k -= d;
		}
	}
}

// writevfull writes all of v[0..n) (advancing the vector).
static void writevfull(int fd, struct iovec *v, int n) {
	for (;;) {
		while (n && v->iov_len == 0)
			v++, n--;
		if (!n)
			return;
		ssize_t k = writev(fd, v, n > 1024 ? 1024 : n);
		if (k < 0 && errno == EAGAIN) {
			sched_yield();
			continue;
		}
		if (k <= 0)
			die("tcp writev");
		for (int j = 0; j < n && k; j++) {
			size_t d = (size_t)k < v[j].iov_len ? (size_t)k : v[j].iov_len;
			v[j].iov_base = (char *)v[j].iov_base + d, v[j].iov_len -= d, k -= d;
		}
	}
}

enum { TCPBATCH = 128 }; // most messages per writev (the tcp transport writes what its send queue holds, 128 work requests in rdmakit perf, in one writev)

static double tcp(long n) {
	int l = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t al = sizeof a;
	if (bind(l, (void *)&a, sizeof a) < 0 || listen(l, 1) < 0 || getsockname(l, (void *)&a, &al) < 0)
		die("listen");
	pid_t pid = spawn();
	if (pid == 0) { // receiver: each readv takes a payload (in place) and the next header
		int s = accept(l, 0, 0);
		char *dst = region();
		ready();
		int one = 1;
		setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
		if (tcpbuf)
			setbufs(s, tcpbuf);
		// CEIL_LOWAT=1: SO_RCVLOWAT as the tcp transport's reader sets it
		// (off by default: with the sender spinning it hung a run now
		// and then, and it made no difference here)
		int lowat = getenv("CEIL_LOWAT") && !spinR;
		if (spinR)
			fcntl(s, F_SETFL, O_NONBLOCK);
		uint64_t h[2];
		struct iovec v[2] = {{h, sizeof h}};
		readvfull(s, v, 1, lowat);
		for (long i = 0; i < n; i++) {
			if (h[1] != MSG || h[0] > REGION - MSG)
				die("tcp header");
			struct iovec w[2] = {{dst + h[0], MSG}, {h, sizeof h}};
			readvfull(s, w, i == n - 1 ? 1 : 2, lowat);
		}
		char b = 1;
		if (write(s, &b, 1) != 1)
			die("tcp ack");
		done();
		_exit(0);
	}
	int s = socket(AF_INET, SOCK_STREAM, 0);
	if (connect(s, (void *)&a, sizeof a) < 0)
		die("connect");
	int one = 1;
	setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	if (tcpbuf)
		setbufs(s, tcpbuf);
	if (spinS)
		fcntl(s, F_SETFL, O_NONBLOCK);
	char *src = region();
	uint64_t h[TCPBATCH][2];
	struct iovec v[2 * TCPBATCH];
	int batch = getenv("CEIL_TCPBATCH") ? atoi(getenv("CEIL_TCPBATCH")) : TCPBATCH;
	if (batch < 1 || batch > TCPBATCH)
		batch = TCPBATCH;
	awaitready();
	double t0 = now();
	for (long i = 0; i < n;) {
		int m = 0;
		for (; m < batch && i < n; m++, i++) {
			h[m][0] = (uint64_t)(i * MSG) % REGION, h[m][1] = MSG;
			v[2 * m] = (struct iovec){h[m], sizeof h[m]};
			v[2 * m + 1] = (struct iovec){src + h[m][0], MSG};
		}
		writevfull(s, v, 2 * m);
	}
	char b;
	for (;;) {
		ssize_t k = read(s, &b, 1);
		if (k == 1)
			break;
		if (k < 0 && errno == EAGAIN) {
			struct pollfd p = {s, POLLIN, 0};
			poll(&p, 1, 1000);
			continue;
		}
		die("tcp final");
	}
	double t = now() - t0;
	collect();
	waitpid(pid, 0, 0);
	return t;
}

// ---- udp ----

struct hdr { // 12 bytes, little endian: datagram number and its offset in the region
	uint32_t seq;
	uint64_t off;
} __attribute__((packed));

enum { COPY = 1, CRC = 2 };

static double udp(long n, int work) {
	int r = socket(AF_INET, SOCK_DGRAM, 0);
	struct sockaddr_in ra = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t al = sizeof ra;
	if (bind(r, (void *)&ra, sizeof ra) < 0 || getsockname(r, (void *)&ra, &al) < 0)
		die("udp bind");
	setbufs(r, window * 8192);
	int one = 1;
	if (setsockopt(r, SOL_UDP, UDP_GRO, &one, sizeof one) < 0)
		die("UDP_GRO");
	int s = socket(AF_INET, SOCK_DGRAM, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	if (bind(s, (void *)&sa, sizeof sa) < 0 || getsockname(s, (void *)&sa, &al) < 0)
		die("udp bind");
	setbufs(s, window * 8192);
	long total = n * PPM;
	pid_t pid = spawn();
	if (pid == 0) { // receiver
		close(s);
		char *dst = region();
		ready();
		static char bufs[BATCH][65536];
		static char ctl[BATCH][CMSG_SPACE(sizeof(int))];
		struct mmsghdr mm[BATCH];
		struct iovec iv[BATCH];
		struct sockaddr_in from;
		long got = 0, acked = 0, bad = 0;
		while (got < total) {
			for (int i = 0; i < BATCH; i++) {
				iv[i] = (struct iovec){bufs[i], sizeof bufs[i]};
				mm[i].msg_hdr = (struct msghdr){.msg_iov = &iv[i], .msg_iovlen = 1,
					.msg_control = ctl[i], .msg_controllen = sizeof ctl[i]};
			}
			mm[0].msg_hdr.msg_name = &from, mm[0].msg_hdr.msg_namelen = sizeof from;
			int k = recvmmsg(r, mm, BATCH, MSG_WAITFORONE | (spinR ? MSG_DONTWAIT : 0), 0);
			if (k < 0 && errno == EAGAIN) {
				sched_yield();
				continue;
			}
			if (k < 0)
				die("recvmmsg");
			for (int i = 0; i < k; i++) {
				int seg = mm[i].msg_len;
				for (struct cmsghdr *c = CMSG_FIRSTHDR(&mm[i].msg_hdr); c; c = CMSG_NXTHDR(&mm[i].msg_hdr, c))
					if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO)
						memcpy(&seg, CMSG_DATA(c), sizeof seg);
				for (unsigned o = 0; o < mm[i].msg_len; o += seg) {
					char *p = bufs[i] + o;
					unsigned len = mm[i].msg_len - o < (unsigned)seg ? mm[i].msg_len - o : (unsigned)seg;
					struct hdr h;
					memcpy(&h, p, sizeof h);
					if (len != DGRAM || h.seq != (uint32_t)got) {
						bad++;
						continue;
					}
					if (work & CRC) {
						uint32_t c;
						memcpy(&c, p + HDR + PAY, 4);
						if (crcfn(0, p, HDR + PAY) != c) {
							bad++;
							continue;
						}
					}
					if (work & COPY)
						memcpy(dst + h.off, p + HDR, PAY);
					got++;
				}
			}
			if (got - acked >= ackevery || got == total) {
				uint64_t a[2] = {got, bad};
				if (sendto(r, a, sizeof a, 0, (void *)&sa, sizeof sa) != sizeof a)
					die("ack");
				acked = got;
			}
		}
		if (bad)
			fprintf(stderr, "receiver: %ld datagrams out of order or bad\n", bad);
		done();
		_exit(bad ? 1 : 0);
	}
	close(r);
	// CEIL_CONNECT: a connected sending socket (no route lookup per send;
	// the kernel then numbers IPv4 identifications per socket)
	int conn = getenv("CEIL_CONNECT") != 0;
	if (conn && connect(s, (void *)&ra, sizeof ra) < 0)
		die("connect");
	char *src = region();
	// arena: datagram i's header at 16*i, its trailer at 16*i+12, so a
	// trailer and the next header go as one iovec.
	static char arena[BATCH * (GSOSEG + 1) * 16];
	static struct iovec iv[BATCH][2 * GSOSEG + 1];
	static char ctl[BATCH][CMSG_SPACE(sizeof(uint16_t))];
	struct mmsghdr mm[BATCH];
	long sent = 0, acked = 0;
	awaitready();
	double t0 = now();
	while (acked < total) {
		// what the window allows, in GSO messages of GSOSEG datagrams
		long can = acked + window - sent;
		if (can > total - sent)
			can = total - sent;
		int nm = 0;
		char *ap = arena;
		while (can > 0 && nm < BATCH) {
			int segs = can < GSOSEG ? can : GSOSEG, v = 0;
			struct iovec *vv = iv[nm];
			for (int j = 0; j < segs; j++, ap += 16) {
				long q = sent + j;
				uint64_t off = (uint64_t)(q * PAY) % REGION;
				struct hdr h = {(uint32_t)q, off};
				memcpy(ap, &h, sizeof h);
				if (work & CRC) {
					uint32_t c = crcfn(crcfn(0, ap, HDR), src + off, PAY);
					memcpy(ap + HDR, &c, 4);
				}
				if (j == 0)
					vv[v++] = (struct iovec){ap, HDR};
				vv[v++] = (struct iovec){src + off, PAY};
				vv[v++] = (struct iovec){ap + HDR, j == segs - 1 ? TRL : TRL + HDR};
			}
			ap += 16; // keep the next message's headers apart
			struct cmsghdr *c = (void *)ctl[nm];
			c->cmsg_level = SOL_UDP, c->cmsg_type = UDP_SEGMENT, c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
			*(uint16_t *)CMSG_DATA(c) = DGRAM;
			mm[nm].msg_hdr = (struct msghdr){.msg_name = conn ? 0 : &ra, .msg_namelen = conn ? 0 : sizeof ra,
				.msg_iov = vv, .msg_iovlen = v, .msg_control = ctl[nm],
				.msg_controllen = segs > 1 ? CMSG_SPACE(sizeof(uint16_t)) : 0};
			sent += segs, can -= segs, nm++;
		}
		for (int done = 0; done < nm;) {
			int k = sendmmsg(s, mm + done, nm - done, 0);
			if (k < 0) {
				if (errno == EAGAIN || errno == ENOBUFS) {
					struct pollfd p = {s, POLLOUT, 0};
					poll(&p, 1, 1);
					continue;
				}
				die("sendmmsg");
			}
			done += k;
		}
		// acknowledgements: drain them; wait only while the window is full
		// (or everything is sent)
		for (;;) {
			uint64_t a[2];
			int must = sent - acked >= window || sent == total;
			if (must && !spinS) {
				struct pollfd p = {s, POLLIN, 0};
				if (poll(&p, 1, 2000) == 0) {
					fprintf(stderr, "sender: no acknowledgement for 2 s (%ld of %ld acked): lost datagrams\n", acked, total);
					kill(pid, 9);
					exit(1);
				}
			}
			if (recv(s, a, sizeof a, MSG_DONTWAIT) != sizeof a) {
				if (!must)
					break;
				if (spinS)
					sched_yield();
				continue;
			}
			if (a[0] > (uint64_t)acked)
				acked = a[0];
			if (acked == total)
				break;
		}
	}
	double t = now() - t0;
	int st;
	collect();
	waitpid(pid, &st, 0);
	if (!WIFEXITED(st) || WEXITSTATUS(st))
		exit(1);
	return t;
}

static double crconly(long n) {
	char *src = region();
	uint32_t c = 0;
	double t0 = now();
	for (long i = 0; i < n; i++)
		c = crcfn(c, src + (i * MSG) % REGION, MSG);
	double t = now() - t0;
	if (c == 1)
		printf(" ");
	return t;
}

int main(int argc, char **argv) {
	if (argc != 3) {
		fprintf(stderr, "usage: ceil tcp|udp|udpcopy|udpcrc|crc N\n");
		return 2;
	}
	pickcrc();
	if (getenv("CEIL_REGION") && atol(getenv("CEIL_REGION")) >= MSG)
		REGION = atol(getenv("CEIL_REGION")) / MSG * MSG;
	if (getenv("CEIL_WINDOW") && atol(getenv("CEIL_WINDOW")) >= 4)
		window = atol(getenv("CEIL_WINDOW"));
	ackevery = getenv("CEIL_ACKEVERY") ? atol(getenv("CEIL_ACKEVERY")) : window / 4;
	if (ackevery < 1)
		ackevery = 1;
	if (getenv("CEIL_TCPBUF"))
		tcpbuf = atoi(getenv("CEIL_TCPBUF"));
	const char *sp = getenv("CEIL_SPIN");
	if (!sp && !strcmp(argv[1], "tcp"))
		sp = "s"; // the tcp transport's requester polls its CQ rather than sleep
	if (sp)
		spinS = strchr(sp, 's') != 0, spinR = strchr(sp, 'r') != 0;
	alarm(120); // a run that hangs (lost datagrams) ends
	long n = atol(argv[2]);
	double t;
	if (!strcmp(argv[1], "tcp"))
		t = tcp(n);
	else if (!strcmp(argv[1], "udp"))
		t = udp(n, 0);
	else if (!strcmp(argv[1], "udpcopy"))
		t = udp(n, COPY);
	else if (!strcmp(argv[1], "udpcrc"))
		t = udp(n, COPY | CRC);
	else if (!strcmp(argv[1], "crc"))
		t = crconly(n);
	else
		return 2;
	printf("%s %.0f MiB/s cpu_us_per_64KiB send %.1f recv %.1f%s%s\n", argv[1], n * (double)MSG / t / (1 << 20),
		cpuS / n * 1e6, cpuR / n * 1e6,
		strcmp(argv[1], "udpcrc") && strcmp(argv[1], "crc") ? "" : " crc=",
		strcmp(argv[1], "udpcrc") && strcmp(argv[1], "crc") ? "" : crcname);
	return 0;
}
