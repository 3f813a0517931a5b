//! The operator's price list as `serve --prices` hands it to the control plane: the file
//! is parsed where `replay` and `usage --prices` parse it (`gpufleet_economics::prices`),
//! and keyed here by the control plane's four capacity classes.

use gpufleet_control::store::usage::{BORROWED_PREEMPTIBLE, BURST, GUARANTEED, ON_DEMAND};
use gpufleet_control::usage_cost::PriceBook;
use gpufleet_economics::prices::{Class, Prices};

/// The price list as serve keeps it: each of the control plane's four capacity classes
/// at the price of the list's class it maps to ([`Class::of_usage`]).
pub fn price_book(prices: &Prices) -> PriceBook {
    PriceBook::new(prices.models().flat_map(|model| {
        [GUARANTEED, BURST, BORROWED_PREEMPTIBLE, ON_DEMAND]
            .into_iter()
            .filter_map(move |usage| {
                let price = prices.per_gpu_hour(model, Class::of_usage(usage)?)?;
                Some(((model.to_string(), usage.to_string()), price))
            })
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `borrowed-preemptible` is priced as `burst`; a class the list leaves out has no price.
    #[test]
    fn every_usage_class_takes_the_price_of_its_list_class() {
        let file = std::path::Path::new("prices.csv");
        let prices = gpufleet_economics::prices::parse_any(
            file,
            "gpu_type,class,per_gpu_hour\nH100-80GB,guaranteed,2.5\nH100-80GB,burst,4\n",
        )
        .unwrap();
        let book = price_book(&prices);
        assert_eq!(book.per_gpu_hour("H100-80GB", GUARANTEED), Some(2.5));
        assert_eq!(book.per_gpu_hour("H100-80GB", BURST), Some(4.0));
        assert_eq!(
            book.per_gpu_hour("H100-80GB", BORROWED_PREEMPTIBLE),
            Some(4.0)
        );
        assert_eq!(book.per_gpu_hour("H100-80GB", ON_DEMAND), None);
        assert_eq!(book.per_gpu_hour("A100-40GB", GUARANTEED), None);
    }
}
