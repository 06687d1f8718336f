#include "tests/support/pmpi_counter.h"

#include <mpi.h>

namespace emu::testing {
namespace {

PmpiBytes counted;

uint64_t payload(int count, MPI_Datatype type, int peer) {
  if (peer == MPI_PROC_NULL || count <= 0) return 0;
  int size = 0;
  PMPI_Type_size(type, &size);
  return static_cast<uint64_t>(count) * static_cast<uint64_t>(size);
}

uint64_t received(const MPI_Status& status, MPI_Datatype type) {
  int count = 0;
  PMPI_Get_count(&status, type, &count);
  return payload(count, type, status.MPI_SOURCE);
}

}  // namespace

PmpiBytes pmpi_bytes() { return counted; }
void pmpi_reset() { counted = {}; }

}  // namespace emu::testing

using emu::testing::counted;

// The profiling interface: definitions with MPI's own names and signatures replace the library's.
extern "C" {

int MPI_Send(const void* buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm) {
  counted.sent += emu::testing::payload(count, type, dest);
  return PMPI_Send(buf, count, type, dest, tag, comm);
}

int MPI_Isend(const void* buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm, MPI_Request* request) {
  counted.sent += emu::testing::payload(count, type, dest);
  return PMPI_Isend(buf, count, type, dest, tag, comm, request);
}

int MPI_Recv(void* buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm, MPI_Status* status) {
  MPI_Status own;
  MPI_Status* kept = status == MPI_STATUS_IGNORE ? &own : status;
  const int rc = PMPI_Recv(buf, count, type, source, tag, comm, kept);
  if (rc == MPI_SUCCESS) counted.received += emu::testing::received(*kept, type);
  return rc;
}

int MPI_Irecv(void* buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm, MPI_Request* request) {
  counted.received += emu::testing::payload(count, type, source);
  return PMPI_Irecv(buf, count, type, source, tag, comm, request);
}

int MPI_Sendrecv(const void* sendbuf, int sendcount, MPI_Datatype sendtype, int dest, int sendtag, void* recvbuf,
                 int recvcount, MPI_Datatype recvtype, int source, int recvtag, MPI_Comm comm, MPI_Status* status) {
  MPI_Status own;
  MPI_Status* kept = status == MPI_STATUS_IGNORE ? &own : status;
  counted.sent += emu::testing::payload(sendcount, sendtype, dest);
  const int rc = PMPI_Sendrecv(sendbuf, sendcount, sendtype, dest, sendtag, recvbuf, recvcount, recvtype, source,
                               recvtag, comm, kept);
  if (rc == MPI_SUCCESS) counted.received += emu::testing::received(*kept, recvtype);
  return rc;
}

}  // extern "C"
