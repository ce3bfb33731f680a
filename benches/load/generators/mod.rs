//! Load generators: the line protocol, gRPC through tonic, the paced h2
//! client and h2load.

pub mod grpc;
pub mod h2;
pub mod h2load;
pub mod line;
