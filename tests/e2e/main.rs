//! The real `sluice` binary, started as users start it, talked to over HTTP.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use sluice_core::testkit::free_port;
use sluice_core::testkit::peers::{spawn_nats, Relay};

mod argo;
mod buses;
mod cli;
mod harness;
mod ingress;
mod sensor;

use harness::*;
