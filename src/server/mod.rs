pub mod rls;
