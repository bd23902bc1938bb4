// gloo_coll_bench: time Gloo collectives (tcp transport) on float32 sum,
// nccl-tests style, for comparison with rdmakit coll-perf.
//
//   RANK=r SIZE=n STORE=dir PREFIX=p gloo_coll_bench allreduce|allgather|reduce_scatter BYTES ITERS WARMUP
//
// Rendezvous through a FileStore directory; devices on 127.0.0.1.
// allreduce uses AllreduceRing, allgather the options API (ring),
// reduce_scatter ReduceScatterHalvingDoubling (the only reduce-scatter in
// this Gloo). Time per call is the maximum over ranks. Prints one line:
// coll size count time_us algbw_GBps busbw_GBps
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce_ring.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

static int envInt(const char* n) {
  const char* v = getenv(n);
  if (!v) {
    fprintf(stderr, "%s not set\n", n);
    exit(2);
  }
  return atoi(v);
}

int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s allreduce|allgather|reduce_scatter BYTES ITERS WARMUP\n", argv[0]);
    return 2;
  }
  int rank = envInt("RANK"), n = envInt("SIZE");
  std::string coll = argv[1];
  long bytes = atol(argv[2]);
  int iters = atoi(argv[3]), warmup = atoi(argv[4]);

  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore fs(getenv("STORE"));
  gloo::rendezvous::PrefixStore store(getenv("PREFIX"), fs);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, n);
  ctx->connectFullMesh(store, dev);

  long count = bytes / 4, part = (count / n) & ~3L; // per rank, 16-byte units (nccl-tests)
  if (part < 1) part = 1;
  long total = std::max(count, part * n);
  std::vector<float> a(total), b(total);
  for (long i = 0; i < total; i++) a[i] = float(rank + i % 7);

  std::unique_ptr<gloo::Algorithm> algo;
  std::unique_ptr<gloo::AllgatherOptions> agopts;
  double factor = double(n - 1) / n, algBytes = double(part) * 4 * n;
  long param = part;
  std::vector<float*> ptrs{a.data()};
  if (coll == "allreduce") {
    algo.reset(new gloo::AllreduceRing<float>(ctx, ptrs, int(count)));
    factor = 2.0 * (n - 1) / n, algBytes = double(count) * 4, param = count;
  } else if (coll == "reduce_scatter") {
    std::vector<int> recvElems(n, int(part));
    algo.reset(new gloo::ReduceScatterHalvingDoubling<float>(ctx, ptrs, int(part * n), recvElems));
  } else if (coll == "allgather") {
    agopts.reset(new gloo::AllgatherOptions(ctx));
    agopts->setInput(a.data(), part);
    agopts->setOutput(b.data(), part * n);
  } else {
    fprintf(stderr, "unknown collective %s\n", coll.c_str());
    return 2;
  }
  auto run = [&] {
    if (agopts) gloo::allgather(*agopts);
    else algo->run();
  };
  for (int i = 0; i < warmup; i++) run();
  gloo::BarrierAllToAll(ctx).run();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; i++) run();
  double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
  // Maximum over ranks.
  std::vector<double*> tp{&t};
  gloo::AllreduceRing<double>(ctx, tp, 1, gloo::ReductionFunction<double>::max).run();
  double algbw = algBytes / 1e9 / t;
  if (rank == 0)
    printf("%s %ld %ld %.3f %.4f %.4f\n", coll.c_str(), long(algBytes), param, t * 1e6, algbw, algbw * factor);
  return 0;
}
